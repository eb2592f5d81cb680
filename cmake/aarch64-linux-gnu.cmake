# Cross build for 64-bit Arm Linux with Debian's cross toolchain
# (g++-aarch64-linux-gnu) against Debian's arm64 packages (multiarch:
# dpkg --add-architecture arm64; libhwy-dev:arm64, libgtest-dev:arm64, ...).
# `make test-arm` configures build-arm/ with it and runs the tests under
# qemu-aarch64, which CMake also uses as the emulator for ctest.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian's multiarch layout: arm64 libraries and their CMake packages live in
# /usr/lib/aarch64-linux-gnu, headers in /usr/include.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
# No -L /usr/aarch64-linux-gnu: that loader is the cross toolchain's glibc
# build, while the arm64 libraries load Debian's multiarch libc6:arm64, and
# the mix hangs at the first std::thread. qemu's default finds the
# multiarch loader, /lib/ld-linux-aarch64.so.1.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
