//! A TCP proxy on loopback that a test can turn into a network fault. It forwards bytes both ways between
//! its clients and one target address until [`Proxy::blackhole`]: from then on nothing passes in either
//! direction, yet every connection stays open and new ones are accepted (and held) — what a dropped route
//! or a firewall that drops packets looks like to both ends, unlike a refused or reset connection. Bytes
//! already sent wait, as TCP retransmits would, and flow again after [`Proxy::forward`]; so do connections
//! the peers did not give up on meanwhile.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy. Dropping it closes the listener and every connection.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    /// True while bytes are forwarded. Every connection's pumps watch it; dropping it ends them.
    forwarding: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let addr = listener.local_addr()?;
        let (forwarding, watching) = watch::channel(true);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watching = watching.clone();
                tokio::spawn(async move {
                    // A target that refuses is a different fault from the one this proxy makes: the client
                    // then sees its connection closed.
                    if let Ok(upstream) = TcpStream::connect(target).await {
                        let (client_read, client_write) = client.into_split();
                        let (upstream_read, upstream_write) = upstream.into_split();
                        tokio::join!(
                            pump(client_read, upstream_write, watching.clone()),
                            pump(upstream_read, client_write, watching),
                        );
                    }
                });
            }
        });
        Ok(Self {
            addr,
            forwarding,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, for clients of an HTTP target.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops forwarding in both directions, holding every connection open.
    pub fn blackhole(&self) {
        self.forwarding.send_replace(false);
    }

    /// Forwards again, starting with whatever waited.
    pub fn forward(&self) {
        self.forwarding.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to` while `forwarding` is true; a read half-closed by the peer is passed on as a
/// shutdown. Returns when either side closes or the proxy is dropped.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut forwarding: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if forwarding.wait_for(|on| *on).await.is_err() {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            // Blackholed while waiting for bytes: stop reading (the kernel buffers hold what comes).
            stopped = forwarding.wait_for(|on| !*on) => {
                if stopped.is_err() {
                    return;
                }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Bytes read just as the proxy was blackholed wait until it forwards again.
        if forwarding.wait_for(|on| *on).await.is_err() || to.write_all(&buffer[..n]).await.is_err()
        {
            return;
        }
    }
}
