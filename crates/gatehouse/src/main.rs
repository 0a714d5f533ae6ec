//! The `gatehouse` command: wiring only. Each plane lives in its own crate.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gatehouse", about = "L7 HTTPS load balancer, L4 load balancer and VPN gateway", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway. SIGHUP reloads the config file; SIGTERM stops.
    Run {
        /// The config file.
        #[arg(short, long, default_value = "gatehouse.yaml")]
        config: PathBuf,
    },
    /// Check a config file: exit 0 if valid, else print every error as
    /// `FILE: path.to.field: what was expected` and exit 1.
    Check {
        #[arg(short, long, default_value = "gatehouse.yaml")]
        config: PathBuf,
    },
    /// Print the version.
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("gatehouse {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Check { config } => match gatehouse_l7::check(&config) {
            Ok(()) => {
                println!("{}: configuration is valid", config.display());
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("GATEHOUSE_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            match gatehouse_l7::run(&config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    for line in e.lines() {
                        tracing::error!("{line}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
    }
}
