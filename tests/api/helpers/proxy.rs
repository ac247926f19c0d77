//! A TCP proxy on loopback that holds a connection's bytes from the
//! client once they contain a chosen string, until the test releases them:
//! a query kept in flight for as long as a test needs, on a connection the
//! server behind still counts (tests/api/replicas.rs). Every other byte,
//! and every byte after the release, passes as it came.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The proxy; it stops, with every connection through it, when dropped.
pub(crate) struct HoldingProxy {
    /// The loopback port it listens on.
    pub(crate) port: u16,
    held: Arc<AtomicUsize>,
    released: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl HoldingProxy {
    /// Proxies to `target`, holding what a client sends once one of its
    /// reads contains `marker` (the marker is looked for within a read:
    /// a PostgreSQL client writes a query's messages in one).
    pub(crate) async fn start(target: std::net::SocketAddr, marker: &'static [u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new(AtomicUsize::new(0));
        let (released, watch) = watch::channel(false);
        let counter = held.clone();
        let accept = tokio::spawn(async move {
            // Owned here: aborting the accept task ends every connection.
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else { continue };
                connections.spawn(relay(client, server, marker, counter.clone(), watch.clone()));
                while connections.try_join_next().is_some() {}
            }
        });
        Self { port, held, released, accept }
    }

    /// Connections whose bytes are held now.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Lets every held byte through, and holds nothing from now on.
    pub(crate) fn release(&self) {
        self.released.send_replace(true);
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Client to server, holding what contains `marker` until released;
/// server to client as it comes. Ends when either side closes.
async fn relay(mut client: TcpStream, mut server: TcpStream, marker: &[u8], held: Arc<AtomicUsize>, mut released: watch::Receiver<bool>) {
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let upstream = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if !*released.borrow() && buf[..n].windows(marker.len()).any(|w| w == marker) {
                held.fetch_add(1, Ordering::AcqRel);
                // Counted off however the wait ends (the relay may be
                // dropped mid-wait).
                let _counted = Counted(&held);
                let _ = released.wait_for(|r| *r).await;
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let downstream = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        () = upstream => {}
        _ = downstream => {}
    }
}

/// Takes one off a count of held connections when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
