//! `floor-server`: a bare tonic `PredictionService` that answers every
//! Predict with one fixed response, built once.
//!
//! It does what any gRPC server on this machine must do — accept, decode
//! the request, encode a response — and nothing sluice does (validation,
//! queues, inference). Its latency is the transport floor and its
//! throughput the ceiling that sluice's figures are measured against.
//!
//! With `--raw` it is leaner still: an echo server that neither decodes
//! the request nor encodes the response (fixed bytes, encoded once), so
//! what is left is HTTP/2 and gRPC framing alone.
//!
//! ```text
//! floor-server --port 9000 --rows 1 --cols 10 [--raw]
//! ```

use std::sync::Arc;

use clap::Parser;
use sluice::api::grpc::served_spec;
use sluice::cli::bench::client::{RawCodec, PREDICT_PATH};
use sluice::config::OutputEncoding;
use sluice::proto::tensorflow::serving::prediction_service_server::{PredictionService, PredictionServiceServer};
use sluice::proto::tensorflow::serving::{
    GetModelMetadataRequest, GetModelMetadataResponse, PredictRequest, PredictResponse,
};
use sluice::tensor::proto::encode;
use sluice::tensor::Tensor;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
struct Args {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port; 0 picks a free one (printed on stdout).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Rows of the fixed `logits` output.
    #[arg(long, default_value_t = 1)]
    rows: i64,
    /// Columns of the fixed `logits` output.
    #[arg(long, default_value_t = 10)]
    cols: i64,
    /// How the output is encoded, as sluice's --output_encoding.
    #[arg(long, value_enum, default_value = "typed-fields")]
    encoding: OutputEncoding,
    /// Name the response's model_spec carries.
    #[arg(long, default_value = "mlp")]
    model: String,
    /// Answer fixed bytes without decoding the request or encoding the
    /// response.
    #[arg(long)]
    raw: bool,
}

/// The `--raw` floor: Predict answered with bytes encoded once.
#[derive(Clone)]
struct RawFloor {
    response: bytes::Bytes,
}

impl tonic::server::UnaryService<bytes::Bytes> for RawFloor {
    type Response = bytes::Bytes;
    type Future = std::future::Ready<Result<Response<bytes::Bytes>, Status>>;

    fn call(&mut self, _request: Request<bytes::Bytes>) -> Self::Future {
        std::future::ready(Ok(Response::new(self.response.clone())))
    }
}

impl<B> tower::Service<http::Request<B>> for RawFloor
where
    B: tonic::codegen::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let floor = self.clone();
        Box::pin(async move {
            if request.uri().path() != PREDICT_PATH {
                return Ok(Status::unimplemented("floor-server --raw answers Predict only").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(floor, request).await)
        })
    }
}

impl tonic::server::NamedService for RawFloor {
    const NAME: &'static str = "tensorflow.serving.PredictionService";
}

struct Floor {
    response: Arc<PredictResponse>,
}

#[tonic::async_trait]
impl PredictionService for Floor {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        // The request is decoded by tonic, as in any server; then dropped.
        drop(request);
        Ok(Response::new((*self.response).clone()))
    }

    async fn get_model_metadata(
        &self,
        _request: Request<GetModelMetadataRequest>,
    ) -> Result<Response<GetModelMetadataResponse>, Status> {
        Err(Status::unimplemented("floor-server answers Predict only"))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let count = (args.rows * args.cols) as usize;
    let logits: Vec<f32> = (0..count).map(|i| i as f32 * 0.01).collect();
    let tensor = Tensor::from_values(vec![args.rows, args.cols], &logits);
    let response = PredictResponse {
        model_spec: Some(served_spec(&args.model, 1)),
        outputs: [("logits".to_string(), encode(&tensor, args.encoding))].into_iter().collect(),
    };
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    println!("floor-server: serving gRPC on {addr}");
    if args.raw {
        let response = bytes::Bytes::from(prost::Message::encode_to_vec(&response));
        tonic::transport::Server::builder()
            .add_service(RawFloor { response })
            .serve_with_incoming_shutdown(incoming, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        return Ok(());
    }
    tonic::transport::Server::builder()
        .add_service(
            PredictionServiceServer::new(Floor { response: Arc::new(response) })
                .max_decoding_message_size(256 << 20)
                .max_encoding_message_size(256 << 20),
        )
        .serve_with_incoming_shutdown(incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
