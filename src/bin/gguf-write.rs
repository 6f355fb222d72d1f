use clap::Parser;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::gguf_write::run(
        lfm::cli::gguf_write::Args::parse_from(lfm::cli::argv()),
    ))
}
