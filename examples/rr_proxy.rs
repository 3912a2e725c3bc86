//! A Service-like TCP round-robin for the burst benchmark (e2e/burst.sh): each new
//! connection goes to the next backend, and bytes pass through untouched (the
//! backends terminate TLS), as with kube-proxy. It is native code so that the proxy,
//! which both cases with several replicas go through, costs little of the machine.
//!
//!   cargo run --release --example rr_proxy -- 19543 19544 19545

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use clap::Parser;
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
struct Args {
    /// Port to listen on (127.0.0.1).
    listen: u16,
    /// Backend ports on 127.0.0.1, taken in turn per connection.
    #[arg(required = true)]
    backends: Vec<u16>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], args.listen))).await?;
    let backends: Arc<Vec<SocketAddr>> = Arc::new(
        args.backends
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let (mut client, _) = listener.accept().await?;
        let backend = backends[next.fetch_add(1, Ordering::Relaxed) % backends.len()];
        tokio::spawn(async move {
            // A backend that is down closes the client's connection, as a Service
            // endpoint that refuses would.
            if let Ok(mut upstream) = TcpStream::connect(backend).await {
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
        });
    }
}
