//! A Predict client that sends pre-encoded request bytes and does not
//! decode the answer: the load generator's client does as little work as a
//! gRPC client can, so the server, not the client, is what is measured, and
//! every target gets exactly the same bytes.

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
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
}

impl RawPredictClient {
    /// Connects to `target` (`http://host:port`).
    pub async fn connect(target: &str) -> Result<RawPredictClient, String> {
        let channel = Endpoint::from_shared(target.to_string())
            .map_err(|e| format!("bad target {target}: {e}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {target}: {e}"))?;
        let grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        Ok(RawPredictClient { grpc })
    }

    /// Sends one encoded PredictRequest; returns the encoded response.
    pub async fn predict(&mut self, request: Bytes, timeout: Option<std::time::Duration>) -> Result<Bytes, Status> {
        self.grpc.ready().await.map_err(|e| Status::unavailable(format!("connection not ready: {e}")))?;
        let mut request = tonic::Request::new(request);
        if let Some(timeout) = timeout {
            request.set_timeout(timeout);
        }
        let response = self.grpc.unary(request, PathAndQuery::from_static(PREDICT_PATH), RawCodec).await?;
        Ok(response.into_inner())
    }
}
