//! The socket under a connection: each address of the server's name in turn, TCP_NODELAY and
//! TCP keepalive set.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

/// How long a connection may be silent before the system checks the peer is still there: a
/// pooled connection a NAT or firewall dropped is then found before a send meets it.
const KEEPALIVE_AFTER: Duration = Duration::from_secs(60);

/// The addresses of `host:port`, in the resolver's order.
pub(super) async fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addresses.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "the name has no address",
        ));
    }
    Ok(addresses)
}

/// A TCP connection to `address` with TCP_NODELAY (pipelined commands and the body leave at
/// once, not after the server's delayed ACK) and keepalive set.
pub(super) async fn connect(address: SocketAddr) -> io::Result<TcpStream> {
    let tcp = TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new().with_time(KEEPALIVE_AFTER);
    socket2::SockRef::from(&tcp).set_tcp_keepalive(&keepalive)?;
    Ok(tcp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_has_nodelay_and_keepalive_set() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("an address");
        let tcp = connect(address).await.expect("connected");
        assert!(tcp.nodelay().expect("readable"));
        assert!(socket2::SockRef::from(&tcp).keepalive().expect("readable"));
    }

    #[tokio::test]
    async fn localhost_resolves_to_at_least_one_address() {
        let addresses = resolve("localhost", 25).await.expect("resolved");
        assert!(addresses.iter().all(|address| address.port() == 25));
    }
}
