//! The Kubernetes client the agent talks to its API server through: kube's own service stack (the base URI,
//! credentials that refresh, extra headers, retries of 429 and 5xx, connect/read/write timeouts) over a TCP
//! connector with Nagle's algorithm off.
//!
//! kube's `Client::try_from(Config)` leaves Nagle on. A new connection's first request is then written right
//! after the TLS handshake's last message and waits for that message's acknowledgement, which the server
//! delays by up to 40 ms: measured here, one or two of the ten connections opened for a release's first
//! wave of Namespaces took 50 ms instead of 10 for their first answer, every run. Requests to an API server
//! are small and latency-bound, which is what `TCP_NODELAY` is for (Go's net package sets it on every
//! connection, the API server's included).
//!
//! Not carried over from kube's builder: its debug `HTTP` spans (the agent's own spans on apply, diff and heal
//! stay) and the expiry stamp of an exec plugin's client certificate (the agent never read it). A kubeconfig
//! that names a proxy is handed to kube's builder unchanged, which refuses it as before (this build has no
//! proxy support), rather than connecting around the proxy.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// A client for `config`, as kube builds one, with `TCP_NODELAY` on every connection.
pub fn client(config: kube::Config) -> kube::Result<kube::Client> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    observed(config, |_| {})
}

/// [`client`], calling `observe` with every request before it is sent (its URI is the path and query): how
/// tests count what the agent asks of a real API server.
pub fn observed(
    config: kube::Config,
    observe: impl Fn(&http::Request<kube::client::Body>) + Clone + Send + Sync + 'static,
) -> kube::Result<kube::Client> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let tls = config.rustls_https_connector_with_connector(tcp)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let hyper_client =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .map_request(move |request: http::Request<kube::client::Body>| {
            observe(&request);
            request
        })
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_naming_a_proxy_is_refused_not_connected_around() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().expect("url"));
        config.proxy_url = Some("http://proxy.example:3128".parse().expect("url"));
        let Err(error) = client(config) else {
            panic!("a proxy was accepted although this build cannot use one");
        };
        assert!(error.to_string().contains("proxy"), "{error}");
    }
}
