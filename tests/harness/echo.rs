//! The OpenAI- and Anthropic-compatible echo upstream, served in the test
//! process.

use std::net::SocketAddr;

use sluice_echo::{EchoOptions, Script};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// An echo upstream on a free loopback port; it stops when dropped.
pub struct Echo {
    addr: SocketAddr,
    script: Script,
    _stop: oneshot::Sender<()>,
}

impl Echo {
    /// Starts serving on the current tokio runtime.
    pub async fn start() -> Echo {
        Echo::start_with(EchoOptions::default()).await
    }

    /// Starts serving with `opts`: pacing, and a script shared with the
    /// caller's clone of `opts.script`, if it kept one.
    pub async fn start_with(opts: EchoOptions) -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the echo upstream");
        let addr = listener.local_addr().expect("the echo listener has an address");
        let script = opts.script.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(sluice_echo::serve(listener, opts, async {
            // Resolves when `_stop` is dropped, too.
            let _ = stopped.await;
        }));
        Echo { addr, script, _stop: stop }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL a route's backend points at (OpenAI's SDKs take this
    /// too).
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The base URL without `/v1`, for Anthropic's SDKs, which add
    /// `/v1/messages` themselves.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// This echo's script: queue failures, count what reached it.
    pub fn script(&self) -> &Script {
        &self.script
    }
}
