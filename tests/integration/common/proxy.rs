//! A TCP proxy between the pipeline and a broker, to cut the network
//! between them. While cut, every connection through it is closed and new
//! ones are refused (nothing listens on its port any more); restored, it
//! listens on the same port again and forwards as before.
//!
//! Kafka clients connect to the addresses the broker advertises in its
//! metadata, not to the bootstrap address they were given, so the broker
//! behind the proxy must advertise the proxy's address on the listener the
//! proxy forwards to (see `network.rs`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy's tasks report, for [`Proxy::cut`] and
/// [`Proxy::restore`] to wait on.
#[derive(Default)]
struct State {
    /// Whether the proxy's port is open.
    listening: AtomicBool,
    /// Connections forwarded right now.
    open: AtomicUsize,
    /// Connections accepted in all.
    accepted: AtomicUsize,
}

/// A running proxy; its runtime (and every connection) ends when dropped.
pub struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    state: Arc<State>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    /// Forwards connections to `listener`'s address (already bound, so that
    /// its port was known before the broker was configured) to `upstream`.
    pub fn start(listener: std::net::TcpListener, upstream: SocketAddr) -> Proxy {
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (cut, cut_rx) = watch::channel(false);
        let state = Arc::new(State::default());
        let listener = runtime.block_on(async { TcpListener::from_std(listener).unwrap() });
        state.listening.store(true, Ordering::SeqCst);
        runtime.spawn(serve(Some(listener), addr, upstream, cut_rx, state.clone()));
        Proxy { addr, cut, state, _runtime: runtime }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Cuts the network: returns once the port is closed and every
    /// connection through the proxy is.
    pub fn cut(&self) {
        self.cut.send_replace(true);
        let done = super::wait_for(Duration::from_secs(10), || {
            !self.state.listening.load(Ordering::SeqCst) && self.state.open.load(Ordering::SeqCst) == 0
        });
        assert!(done, "the proxy did not close its port and connections within 10 s");
    }

    /// Restores the network: returns once the port accepts connections again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
        let done = super::wait_for(Duration::from_secs(10), || self.state.listening.load(Ordering::SeqCst));
        assert!(done, "the proxy could not listen on {} again within 10 s", self.addr);
    }
}

/// Accepts and forwards while not cut; closes the port while cut, and
/// opens it again (on the same address) when restored.
async fn serve(
    mut listener: Option<TcpListener>,
    addr: SocketAddr,
    upstream: SocketAddr,
    mut cut: watch::Receiver<bool>,
    state: Arc<State>,
) {
    // Each connection watches the cut on a receiver of its own.
    let for_connections = cut.clone();
    loop {
        let open = match listener.take() {
            Some(l) => l,
            None => {
                if cut.wait_for(|c| !*c).await.is_err() {
                    return;
                }
                match TcpListener::bind(addr).await {
                    Ok(l) => {
                        state.listening.store(true, Ordering::SeqCst);
                        l
                    }
                    Err(_) => {
                        // The port may linger a moment after closing.
                        tokio::time::sleep(Duration::from_millis(50)).await; // retry interval
                        continue;
                    }
                }
            }
        };
        loop {
            tokio::select! {
                accepted = open.accept() => {
                    if let Ok((client, _)) = accepted {
                        state.accepted.fetch_add(1, Ordering::SeqCst);
                        state.open.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(forward(client, upstream, for_connections.clone(), state.clone()));
                    }
                }
                changed = cut.wait_for(|c| *c) => {
                    if changed.is_err() {
                        return;
                    }
                    break;
                }
            }
        }
        drop(open);
        state.listening.store(false, Ordering::SeqCst);
    }
}

/// Copies both ways between `client` and `upstream` until either side
/// closes or the network is cut; then both sockets are closed.
async fn forward(mut client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>, state: Arc<State>) {
    if let Ok(mut server) = TcpStream::connect(upstream).await {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
            _ = cut.wait_for(|c| *c) => {}
        }
    }
    drop(client);
    state.open.fetch_sub(1, Ordering::SeqCst);
}
