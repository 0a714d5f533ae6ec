//! The `gatehouse` command: wiring only. Each plane lives in its own crate.

#![deny(unsafe_code)] // allowed only in boring_heap

mod boring_heap;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use gatehouse_plane::{Init, Plane, PlaneError};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        /// Take the listening sockets over from the Gatehouse running on the
        /// same config (binary upgrade): it stops accepting once this one
        /// accepts, finishes its requests in flight and exits.
        #[arg(long)]
        takeover: bool,
    },
    /// Check a config file: exit 0 if valid, else print every error as
    /// `FILE: path.to.field: what was expected` and exit 1.
    Check {
        #[arg(short, long, default_value = "gatehouse.yaml")]
        config: PathBuf,
    },
    /// The active/standby role of the Gatehouse running on this config
    /// (`l4.ha`): with ROLE (master, backup or fault) sets it, as
    /// keepalived's notify script does; without, prints it (exit 1 when no
    /// Gatehouse answers: a keepalived track_script).
    Ha {
        /// master, backup or fault (any case, as keepalived writes them).
        role: Option<String>,
        #[arg(short, long, default_value = "gatehouse.yaml")]
        config: PathBuf,
    },
    /// Print the version.
    Version,
    /// Measure on this machine (single-threaded, ends with one line per result).
    Bench {
        #[command(subcommand)]
        what: gatehouse_bench::Bench,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("gatehouse {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Bench { what } => gatehouse_bench::run(what),
        Command::Ha { role, config } => {
            let role = match role.as_deref().map(|r| (r, gatehouse_config::HaRole::parse(r))) {
                None => None,
                Some((_, Some(r))) => Some(r),
                Some((text, None)) => {
                    eprintln!("{text:?} is not a role: expected master, backup or fault");
                    return ExitCode::FAILURE;
                }
            };
            match gatehouse_node::ha_request(&config, role) {
                Ok(r) => {
                    println!("{}", r.name());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gatehouse ha: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { config } => match gatehouse_node::check(&config, Box::new(planes)) {
            Ok(()) => {
                println!("{}: configuration is valid", config.display());
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        },
        Command::Run { config, takeover } => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("GATEHOUSE_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            raise_open_files_limit();
            match gatehouse_node::run(&config, takeover, Box::new(planes), Some(Box::new(gatehouse_admin::start))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    for line in e.to_string().lines() {
                        tracing::error!("{line}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The planes of this binary, peers under the node.
fn planes(init: &Init<'_>) -> Result<Vec<Arc<dyn Plane>>, PlaneError> {
    Ok(vec![
        Arc::new(gatehouse_l7::L7::new(init)?),
        Arc::new(gatehouse_l4_io::L4::new(init)),
        Arc::new(gatehouse_wg_io::WireGuard::new(init)),
    ])
}

/// Raises the soft limit on open files to the hard limit, as HAProxy does
/// for its maxconn: every client connection, every pooled upstream
/// connection (the pool keeps as many as the busiest moment needed) and
/// every listener is a descriptor, and a service manager's usual soft
/// limit of 1,024 would refuse connections long before memory runs out.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!("open files limit raised from {soft} to {hard}"),
            Err(e) => tracing::warn!("open files limit stays at {soft}: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open files limit: {e}"),
    }
}
