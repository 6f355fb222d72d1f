use clap::Parser;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::kld::run(lfm::cli::kld::Args::parse_from(
        lfm::cli::argv(),
    )))
}
