fn main() {
    std::process::exit(verno_cli::main())
}
