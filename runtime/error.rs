//! The runtime's one error type and its one mapping to gRPC codes, HTTP
//! statuses and metric labels.
//!
//! Every layer returns [`Error`]; the API edges turn it into a
//! `tonic::Status` or an HTTP answer through [`Error::code`], so a given
//! failure always gets the same code on every protocol. Messages are written
//! where the failure is found and name the field, the value and what was
//! expected; nothing here rewrites them.

use std::fmt;

/// The status codes the runtime answers with: gRPC's canonical codes (which
/// TensorFlow shares), restricted to the ones sluice produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// The client gave up or went away before the answer was ready.
    Cancelled,
    /// Malformed or mismatched input: dtype, shape, names, empty request.
    InvalidArgument,
    /// The request's deadline passed before it could be answered.
    DeadlineExceeded,
    /// Unknown model, version, label or plugin.
    NotFound,
    /// The thing to create exists already.
    AlreadyExists,
    /// The caller is known but may not do this.
    PermissionDenied,
    /// A bounded queue or a limit is full; the caller may retry later.
    ResourceExhausted,
    /// The request is well formed but the target is not in a state to serve
    /// it (TF Serving's choice for an unknown signature).
    FailedPrecondition,
    /// Not served by this server.
    Unimplemented,
    /// A broken invariant or a failure inside a model or plugin.
    Internal,
    /// A dependency (upstream, feature store) or the server itself is down
    /// or shutting down.
    Unavailable,
    /// No or unknown credentials.
    Unauthenticated,
    /// A request body or message over the size limit.
    TooLarge,
    /// Well-formed but refused on its content: an uploaded plugin that
    /// does not compile, is of the wrong world, fails its sample or does
    /// not fit its pipeline.
    Unprocessable,
}

impl Code {
    /// The gRPC code.
    pub fn grpc(self) -> tonic::Code {
        match self {
            Code::Cancelled => tonic::Code::Cancelled,
            Code::InvalidArgument => tonic::Code::InvalidArgument,
            Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Code::NotFound => tonic::Code::NotFound,
            Code::AlreadyExists => tonic::Code::AlreadyExists,
            Code::PermissionDenied => tonic::Code::PermissionDenied,
            Code::ResourceExhausted => tonic::Code::ResourceExhausted,
            Code::FailedPrecondition => tonic::Code::FailedPrecondition,
            Code::Unimplemented => tonic::Code::Unimplemented,
            Code::Internal => tonic::Code::Internal,
            Code::Unavailable => tonic::Code::Unavailable,
            Code::Unauthenticated => tonic::Code::Unauthenticated,
            // gRPC's own choice for a message over the size limit.
            Code::TooLarge => tonic::Code::ResourceExhausted,
            Code::Unprocessable => tonic::Code::InvalidArgument,
        }
    }

    /// The HTTP status TF Serving's REST API derives from the code.
    pub fn http(self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => S::BAD_REQUEST,
            Code::Unauthenticated => S::UNAUTHORIZED,
            Code::PermissionDenied => S::FORBIDDEN,
            Code::NotFound => S::NOT_FOUND,
            Code::AlreadyExists => S::CONFLICT,
            Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
            Code::Unimplemented => S::NOT_IMPLEMENTED,
            Code::Unavailable => S::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
            Code::TooLarge => S::PAYLOAD_TOO_LARGE,
            Code::Unprocessable => S::UNPROCESSABLE_ENTITY,
            // 499 is the de facto "client closed request"; TF Serving answers 500.
            Code::Cancelled | Code::Internal => S::INTERNAL_SERVER_ERROR,
        }
    }

    /// The canonical upper-case name, as in `tensorflow.error.Code`; also the
    /// `code` label of request metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Cancelled => "CANCELLED",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::TooLarge => "RESOURCE_EXHAUSTED",
            Code::Unprocessable => "INVALID_ARGUMENT",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure anywhere in the runtime, with a message for the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    code: Code,
    message: String,
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with an explicit code.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error { code, message: message.into() }
    }

    /// Malformed or mismatched input.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// Unknown model, version, label or plugin.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// The target cannot serve this request in its current state.
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(Code::FailedPrecondition, message)
    }

    /// A bounded queue is full: names the queue and its capacity.
    pub fn queue_full(queue: &str, capacity: usize) -> Self {
        Self::new(Code::ResourceExhausted, format!("{queue} is full ({capacity} waiting); retry later or slow down"))
    }

    /// A limit other than a queue is exhausted.
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, message)
    }

    /// The request's deadline passed; `at` says where it was when it did.
    pub fn deadline_exceeded(at: &str) -> Self {
        Self::new(Code::DeadlineExceeded, format!("deadline exceeded {at}; the request was not run"))
    }

    /// A dependency or the server is not available.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    /// A failure inside the server, a model or a plugin.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// Not served by this server.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// The status code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The message for the client.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `context` put in front of its message.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error { code: self.code, message: format!("{context}: {}", self.message) }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        tonic::Status::new(error.code.grpc(), error.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_tf_serving_http_statuses() {
        let cases = [
            (Code::InvalidArgument, 400),
            (Code::FailedPrecondition, 400),
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::NotFound, 404),
            (Code::AlreadyExists, 409),
            (Code::ResourceExhausted, 429),
            (Code::Unimplemented, 501),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Internal, 500),
            (Code::TooLarge, 413),
            (Code::Unprocessable, 422),
        ];
        for (code, http) in cases {
            assert_eq!(code.http().as_u16(), http, "{code}");
        }
    }

    #[test]
    fn status_keeps_code_and_message() {
        let status: tonic::Status = Error::queue_full("batch queue of model 'cnn'", 8).into();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("batch queue of model 'cnn'"));
        assert!(status.message().contains('8'));
    }
}
