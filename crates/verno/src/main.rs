/// mimalloc instead of glibc's malloc: after a burst (an overload of large requests) glibc kept
/// the freed memory in its per-thread arenas and RSS stayed at twice its resting size, while
/// mimalloc returns freed pages to the system (measured with `bench/reliability.sh overload`,
/// figures in docs/benchmarks.md). A well-kept crate; no unsafe code of ours. Built with
/// `MI_DEFAULT_ARENA_EAGER_COMMIT=0` (`.cargo/config.toml`): arenas are committed as used, not
/// up front, which keeps ~20 MiB of untouched arena out of RSS.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(verno_cli::main())
}
