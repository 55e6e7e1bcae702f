//! Load generator: `rapidws-load <echo|idle|handshake|stream|deflate|client|...> --help`.
//!
//! Prints one JSON object per line on stdout: `{"event":"measure"}` when the
//! measured window starts (so a runner can sample the server's CPU time), then
//! a result object. Single-threaded on purpose: pin it to one core.

use std::process::ExitCode;

use clap::Parser;
use rapidws_load::{Mode, raise_fd_limit};

fn main() -> ExitCode {
    let mode = Mode::parse();
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let local = tokio::task::LocalSet::new();
    match local.block_on(&runtime, mode.run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
