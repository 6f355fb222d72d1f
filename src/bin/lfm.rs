use clap::Parser;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::Lfm::parse_from(lfm::cli::argv()).run())
}
