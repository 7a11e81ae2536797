fn main() -> std::process::ExitCode {
    poolkeeper::cli::main()
}
