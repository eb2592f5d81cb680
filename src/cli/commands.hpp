// The subcommands of the `attn` command-line tool.
#pragma once

namespace attn::cli {

int run_demo();

}  // namespace attn::cli
