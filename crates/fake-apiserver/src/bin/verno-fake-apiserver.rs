//! The fake API server as a process, for tools that need a cluster to talk to (a real kubectl,
//! the chainsaw runner): plain HTTP on loopback, a kubeconfig written for its clients.
//!
//!   verno-fake-apiserver [--port P] [--kubeconfig-out FILE]
//!
//! Prints `listening on http://127.0.0.1:P` once it serves, and runs until SIGTERM or Ctrl-C.

use std::net::SocketAddr;

fn usage() -> ! {
    eprintln!("usage: verno-fake-apiserver [--port P] [--kubeconfig-out FILE]");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let mut port: u16 = 0;
    let mut kubeconfig: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--port", Some(p)) => match p.parse() {
                Ok(p) => port = p,
                Err(e) => {
                    eprintln!("Error: --port {p:?}: {e}");
                    std::process::exit(2)
                }
            },
            ("--kubeconfig-out", Some(f)) => kubeconfig = Some(f.into()),
            _ => usage(),
        }
    }
    let server = match fake_apiserver::FakeApiServer::start_on(
        SocketAddr::from(([127, 0, 0, 1], port)),
        fake_apiserver::default_resources(),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("Error: cannot listen on 127.0.0.1:{port}: {e}");
            std::process::exit(1)
        }
    };
    if let Some(f) = &kubeconfig
        && let Err(e) = std::fs::write(f, server.kubeconfig())
    {
        eprintln!("Error: cannot write the kubeconfig {}: {e}", f.display());
        std::process::exit(1)
    }
    println!("listening on {}", server.url());
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("Error: cannot wait for SIGTERM: {e}");
            std::process::exit(1)
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
