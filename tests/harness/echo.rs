//! The OpenAI-compatible echo upstream, served in the test process.

use std::net::SocketAddr;

use sluice_echo::EchoOptions;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// An echo upstream on a free loopback port; it stops when dropped.
pub struct Echo {
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl Echo {
    /// Starts serving on the current tokio runtime.
    pub async fn start() -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the echo upstream");
        let addr = listener.local_addr().expect("the echo listener has an address");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(sluice_echo::serve(listener, EchoOptions::default(), async {
            // Resolves when `_stop` is dropped, too.
            let _ = stopped.await;
        }));
        Echo { addr, _stop: stop }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL a route's backend points at.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}
