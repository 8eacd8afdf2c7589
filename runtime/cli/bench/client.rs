//! A Predict client that sends pre-encoded request bytes and does not
//! decode the answer: the load generator's client does as little work as a
//! gRPC client can, so the server, not the client, is what is measured, and
//! every target gets exactly the same bytes.

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Status;

/// TF Serving's Predict method.
pub const PREDICT_PATH: &str = "/tensorflow.serving.PredictionService/Predict";

/// Passes bytes through unchanged in both directions.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let len = src.remaining();
        Ok(Some(src.copy_to_bytes(len)))
    }
}

/// One HTTP/2 connection to the target; clones share it.
#[derive(Clone)]
pub struct RawPredictClient {
    grpc: tonic::client::Grpc<Channel>,
    /// The method called: Predict unless [`RawPredictClient::calling`].
    method: PathAndQuery,
    /// Sent as `x-sluice-priority` with every call, when set.
    priority: Option<tonic::metadata::AsciiMetadataValue>,
}

impl RawPredictClient {
    /// Connects to `target` (`http://host:port`, or `https://` with `tls`).
    pub async fn connect(target: &str, tls: Option<&ClientTlsConfig>) -> anyhow::Result<RawPredictClient> {
        let channel =
            endpoint(target, tls)?.connect().await.map_err(|e| anyhow::anyhow!("cannot connect to {target}: {e}"))?;
        let grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        Ok(RawPredictClient { grpc, method: PathAndQuery::from_static(PREDICT_PATH), priority: None })
    }

    /// The same connection, sending `priority` (`high`, `low`, a level) as
    /// `x-sluice-priority` with every call.
    pub fn with_priority(mut self, priority: &str) -> anyhow::Result<RawPredictClient> {
        self.priority = Some(priority.parse().map_err(|e| anyhow::anyhow!("bad priority {priority:?}: {e}"))?);
        Ok(self)
    }

    /// The same connection, sending its requests to `method`
    /// (`/package.Service/Method`) instead of Predict.
    pub fn calling(mut self, method: &str) -> anyhow::Result<RawPredictClient> {
        self.method = PathAndQuery::try_from(method).map_err(|e| anyhow::anyhow!("bad gRPC method {method}: {e}"))?;
        Ok(self)
    }

    /// Sends one encoded PredictRequest; returns the encoded response.
    pub async fn predict(&mut self, request: Bytes, timeout: Option<std::time::Duration>) -> Result<Bytes, Status> {
        self.grpc.ready().await.map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
        let mut request = tonic::Request::new(request);
        if let Some(timeout) = timeout {
            request.set_timeout(timeout);
        }
        if let Some(priority) = &self.priority {
            request.metadata_mut().insert(crate::pipeline::priority::PRIORITY_HEADER, priority.clone());
        }
        let response = self.grpc.unary(request, self.method.clone(), RawCodec).await?;
        Ok(response.into_inner())
    }
}

/// The endpoint of a gRPC `target`, in TLS with `tls`.
pub fn endpoint(target: &str, tls: Option<&ClientTlsConfig>) -> anyhow::Result<Endpoint> {
    let mut endpoint = Endpoint::from_shared(target.to_string())
        .map_err(|e| anyhow::anyhow!("bad target {target}: {e}"))?
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls.clone()).map_err(|e| anyhow::anyhow!("TLS to {target}: {e}"))?;
    }
    Ok(endpoint)
}

/// The TLS settings of a client trusting the CA in `ca` (PEM file), with
/// the certificate and key in `identity` when the server verifies clients.
pub fn tls_config(
    ca: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> anyhow::Result<ClientTlsConfig> {
    let read = |path: &std::path::Path| std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()));
    let mut config = ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
    if let Some((cert, key)) = identity {
        config = config.identity(tonic::transport::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(config)
}

/// An HTTP/1.1 client of one server, one connection per clone (HTTP/1.1
/// does not multiplex): each load worker gets its own connection, opened
/// on first use and again whenever the server closed it.
pub struct RestClient {
    addr: std::net::SocketAddr,
    connection: Option<hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>>,
}

impl Clone for RestClient {
    fn clone(&self) -> Self {
        RestClient { addr: self.addr, connection: None }
    }
}

/// What a REST call returned.
#[derive(Debug)]
pub struct RestResponse {
    /// The HTTP status.
    pub status: http::StatusCode,
    /// The headers.
    pub headers: http::HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl RestResponse {
    /// The body as text (lossy), for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl RestClient {
    /// A client of `target` (`http://host:port` or `host:port`).
    pub fn new(target: &str) -> anyhow::Result<RestClient> {
        let authority = target.strip_prefix("http://").unwrap_or(target).trim_end_matches('/');
        let addr = authority
            .parse()
            .map_err(|e| anyhow::anyhow!("bad REST target {target}: {e} (expected http://IP:PORT)"))?;
        Ok(RestClient { addr, connection: None })
    }

    async fn connect(&self) -> anyhow::Result<hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", self.addr))?;
        stream.set_nodelay(true).map_err(|e| anyhow::anyhow!("TCP_NODELAY: {e}"))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| anyhow::anyhow!("HTTP handshake with {} failed: {e}", self.addr))?;
        tokio::spawn(connection);
        Ok(sender)
    }

    /// Sends one request and reads the whole answer.
    pub async fn call(
        &mut self,
        method: http::Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<RestResponse> {
        use http_body_util::BodyExt;
        let reusable = match self.connection.as_mut() {
            Some(sender) => sender.ready().await.is_ok(),
            None => false,
        };
        if !reusable {
            self.connection = Some(self.connect().await?);
        }
        let sender = self.connection.as_mut().ok_or_else(|| anyhow::anyhow!("no connection"))?;
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(http_body_util::Full::new(body)).map_err(|e| anyhow::anyhow!("bad request: {e}"))?;
        let response = sender.send_request(request).await.map_err(|e| {
            self.connection = None;
            anyhow::anyhow!("{path}: {e}")
        })?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| anyhow::anyhow!("{path}: reading the body: {e}"))?.to_bytes();
        Ok(RestResponse { status: parts.status, headers: parts.headers, body })
    }
}

/// The gRPC status matching an HTTP status of TF Serving's REST API.
pub fn status_of_http(status: http::StatusCode, body: &[u8]) -> Status {
    let message = String::from_utf8_lossy(body).into_owned();
    match status.as_u16() {
        400 => Status::invalid_argument(message),
        401 => Status::unauthenticated(message),
        403 => Status::permission_denied(message),
        404 => Status::not_found(message),
        409 => Status::already_exists(message),
        413 | 429 => Status::resource_exhausted(message),
        501 => Status::unimplemented(message),
        503 => Status::unavailable(message),
        504 => Status::deadline_exceeded(message),
        _ => Status::internal(message),
    }
}

/// The load generator's client: gRPC with encoded `PredictRequest`s, or
/// REST with JSON bodies posted to `/v1/models/NAME:predict`.
#[derive(Clone)]
pub enum LoadClient {
    /// gRPC, over a shared HTTP/2 connection.
    Grpc(RawPredictClient),
    /// REST, over this worker's own connection.
    Rest {
        /// The connection.
        client: RestClient,
        /// `/v1/models/NAME[/versions/N]:predict`.
        path: std::sync::Arc<str>,
    },
}

impl LoadClient {
    /// Sends one prepared request (encoded proto or JSON body).
    pub async fn predict(&mut self, request: Bytes, timeout: Option<std::time::Duration>) -> Result<Bytes, Status> {
        match self {
            LoadClient::Grpc(client) => client.predict(request, timeout).await,
            LoadClient::Rest { client, path } => {
                let response = client
                    .call(http::Method::POST, path, &[], request)
                    .await
                    .map_err(|e| Status::unavailable(e.to_string()))?;
                if response.status.is_success() {
                    Ok(response.body)
                } else {
                    Err(status_of_http(response.status, &response.body))
                }
            }
        }
    }
}
