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
    /// Measure on this machine (single-threaded, ends with one line per result).
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// Private-key operations per second on one core, per engine and key size:
    /// `keyops engine=mb key=rsa2048 ops_per_sec=N`.
    Keyops {
        /// Seconds per engine and key size.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// RSA sizes to measure (ECDSA P-256 is always measured).
        #[arg(long, value_delimiter = ',', default_values_t = [2048u32, 3072, 4096])]
        rsa: Vec<u32>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("gatehouse {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Bench { what: Bench::Keyops { seconds, rsa } } => {
            let time = std::time::Duration::from_secs_f64(seconds.max(0.1));
            eprintln!(
                "gatehouse bench keyops: {seconds}s per engine and key, one thread; AVX-512 IFMA {}",
                if gatehouse_mbx::available() { "present (mb measured)" } else { "absent (mb skipped)" }
            );
            let results = gatehouse_keyops::bench::run(time, &rsa, |r| eprintln!("  {:>6} {:<10} {:>10.0} ops/s", r.engine, r.key, r.ops_per_sec));
            for bits in &rsa {
                if let Some(b) = gatehouse_keyops::bench::break_even(&results, &format!("rsa{bits}")) {
                    eprintln!("  rsa{bits}: one mb batch of 8 costs {b:.2} boring operations (break-even {})", b.ceil());
                }
            }
            for r in &results {
                println!("{r}");
            }
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
