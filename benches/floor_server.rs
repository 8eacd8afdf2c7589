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
//! With `--per-core` (and `--raw`) the echo runs thread-per-core: one
//! current-thread tokio runtime per core, each accepting on its own
//! SO_REUSEPORT listener of the same port, so a connection's calls never
//! leave its thread (the layout actix-web and others use), where the
//! default is tokio's work-stealing runtime.
//!
//! ```text
//! floor-server --port 9000 --rows 1 --cols 10 [--raw [--per-core]]
//! ```

use std::sync::Arc;

use clap::Parser;
use sluice::api::grpc::served_spec;
use sluice::cli::bench::client::{RawCodec, PREDICT_PATH};
use sluice::config::OutputEncoding;
use sluice::proto::tensorflow::serving::prediction_service_server::{PredictionService, PredictionServiceServer};
use sluice::proto::tensorflow::serving::{
    ClassificationRequest, ClassificationResponse, GetModelMetadataRequest, GetModelMetadataResponse,
    MultiInferenceRequest, MultiInferenceResponse, PredictRequest, PredictResponse, RegressionRequest,
    RegressionResponse,
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
    /// With --raw: one single-threaded runtime per core, each with its
    /// own listener on the port (SO_REUSEPORT).
    #[arg(long, requires = "raw")]
    per_core: bool,
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

    async fn classify(
        &self,
        _request: Request<ClassificationRequest>,
    ) -> Result<Response<ClassificationResponse>, Status> {
        Err(Status::unimplemented("floor-server answers Predict only"))
    }

    async fn regress(&self, _request: Request<RegressionRequest>) -> Result<Response<RegressionResponse>, Status> {
        Err(Status::unimplemented("floor-server answers Predict only"))
    }

    async fn multi_inference(
        &self,
        _request: Request<MultiInferenceRequest>,
    ) -> Result<Response<MultiInferenceResponse>, Status> {
        Err(Status::unimplemented("floor-server answers Predict only"))
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.per_core {
        return per_core(&args);
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(serve(args))
}

/// A listener on `host:port` that other sockets may share (SO_REUSEPORT),
/// registered with the current runtime.
fn shared_listener(host: &str, port: u16) -> anyhow::Result<tokio::net::TcpListener> {
    let addr: std::net::SocketAddr = format!("{host}:{port}").parse()?;
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseport(true)?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket.listen(1024)?)
}

/// The raw echo, thread-per-core: the first thread binds (port 0 picks
/// one), the others join the same port.
fn per_core(args: &Args) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let response = bytes::Bytes::from(prost::Message::encode_to_vec(&fixed_response(args)));
    let mut port = args.port;
    let mut threads = Vec::new();
    for core in 0..cores {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (host, response) = (args.host.clone(), response.clone());
        threads.push(std::thread::Builder::new().name(format!("core-{core}")).spawn(
            move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                runtime.block_on(async move {
                    let listener = match shared_listener(&host, port) {
                        Ok(listener) => listener,
                        Err(e) => {
                            let _ = bound_tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    let _ = bound_tx.send(Ok(listener.local_addr()?));
                    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                    tonic::transport::Server::builder()
                        .add_service(RawFloor { response })
                        .serve_with_incoming(incoming)
                        .await?;
                    Ok(())
                })
            },
        )?);
        let addr = bound_rx.recv()??;
        port = addr.port();
        if core == 0 {
            println!("floor-server: serving gRPC on {addr}");
        }
    }
    for thread in threads {
        thread.join().map_err(|_| anyhow::anyhow!("a core's thread panicked"))??;
    }
    Ok(())
}

fn fixed_response(args: &Args) -> PredictResponse {
    let count = (args.rows * args.cols) as usize;
    let logits: Vec<f32> = (0..count).map(|i| i as f32 * 0.01).collect();
    let tensor = Tensor::from_values(vec![args.rows, args.cols], &logits);
    PredictResponse {
        model_spec: Some(served_spec(&args.model, 1)),
        outputs: [("logits".to_string(), encode(&tensor, args.encoding))].into_iter().collect(),
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let response = fixed_response(&args);
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
