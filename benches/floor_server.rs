//! `floor-server`: a bare tonic `PredictionService` that answers every
//! Predict with one fixed response, built once.
//!
//! It does what any gRPC server on this machine must do — accept, decode
//! the request, encode a response — and nothing sluice does (validation,
//! queues, inference). Its latency is the transport floor and its
//! throughput the ceiling that sluice's figures are measured against.
//!
//! ```text
//! floor-server --port 9000 --rows 1 --cols 10
//! ```

use std::sync::Arc;

use clap::Parser;
use sluice::api::grpc::served_spec;
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
