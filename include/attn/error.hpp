// Errors raised by attn. Every invalid input is reported with one of these,
// with a message that names the argument and the shapes or values involved.
#pragma once

#include <stdexcept>
#include <string>

namespace attn {

// Base of every error attn throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value or shape is invalid (Python: ValueError).
class ValueError : public Error {
 public:
  using Error::Error;
};

// An argument has the wrong kind, e.g. an unsupported dtype (Python: TypeError).
class TypeError : public Error {
 public:
  using Error::Error;
};

// A name or id that is not there, e.g. a PagedKVCache sequence id never
// added or already removed (Python: KeyError; C: ATTN_ERROR_INVALID_ARGUMENT).
class KeyError : public Error {
 public:
  using Error::Error;
};

// A result would not fit in this machine's memory, known before allocating
// (Python: MemoryError; C: ATTN_ERROR_OUT_OF_MEMORY). The message says what
// to ask for instead.
class MemoryError : public Error {
 public:
  using Error::Error;
};

// The system refused a resource, e.g. could not start a thread (Python:
// RuntimeError).
class RuntimeError : public Error {
 public:
  using Error::Error;
};

}  // namespace attn
