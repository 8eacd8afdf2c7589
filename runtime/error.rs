//! The runtime's one error type and its one mapping to gRPC codes, HTTP
//! statuses and metric labels.
//!
//! Every layer returns [`Error`], an enum of failure kinds; callers that
//! must tell failures apart match on the kind ([`Error::QueueFull`],
//! [`Error::DeadlineExceeded`], [`Error::Plugin`] with its
//! [`PluginFault`], …), never on the message. [`Error::code`] is the only
//! place a kind becomes a status: the API edges turn it into a
//! `tonic::Status` or an HTTP answer through it, so a given failure gets
//! the same code on every protocol, and metric labels come from the same
//! table. Messages are written where the failure is found and name the
//! field, the value and what was expected. Configuration has its own
//! [`ConfigError`] (a file and a key), which converts into this one.

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
    /// A change lost a race with another writer; retrying may succeed.
    Aborted,
    /// The client sent its request too slowly.
    RequestTimeout,
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
    /// The path exists but not for this HTTP method.
    MethodNotAllowed,
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
            Code::Aborted => tonic::Code::Aborted,
            Code::RequestTimeout => tonic::Code::DeadlineExceeded,
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
            Code::MethodNotAllowed => tonic::Code::Unimplemented,
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
            Code::AlreadyExists | Code::Aborted => S::CONFLICT,
            Code::RequestTimeout => S::REQUEST_TIMEOUT,
            Code::ResourceExhausted => S::TOO_MANY_REQUESTS,
            Code::Unimplemented => S::NOT_IMPLEMENTED,
            Code::Unavailable => S::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => S::GATEWAY_TIMEOUT,
            Code::TooLarge => S::PAYLOAD_TOO_LARGE,
            Code::Unprocessable => S::UNPROCESSABLE_ENTITY,
            Code::MethodNotAllowed => S::METHOD_NOT_ALLOWED,
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
            Code::Aborted => "ABORTED",
            Code::RequestTimeout => "DEADLINE_EXCEEDED",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::Unimplemented => "UNIMPLEMENTED",
            Code::Internal => "INTERNAL",
            Code::Unavailable => "UNAVAILABLE",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::TooLarge => "RESOURCE_EXHAUSTED",
            Code::Unprocessable => "INVALID_ARGUMENT",
            Code::MethodNotAllowed => "UNIMPLEMENTED",
        }
    }

    /// The canonical name of a gRPC code a client received: the inverse of
    /// [`Code::grpc`], for the load generator's outcome counts.
    pub fn name_of_grpc(code: tonic::Code) -> &'static str {
        use tonic::Code as C;
        match code {
            C::Ok => "OK",
            C::Cancelled => "CANCELLED",
            C::Unknown => "UNKNOWN",
            C::InvalidArgument => "INVALID_ARGUMENT",
            C::DeadlineExceeded => "DEADLINE_EXCEEDED",
            C::NotFound => "NOT_FOUND",
            C::AlreadyExists => "ALREADY_EXISTS",
            C::PermissionDenied => "PERMISSION_DENIED",
            C::ResourceExhausted => "RESOURCE_EXHAUSTED",
            C::FailedPrecondition => "FAILED_PRECONDITION",
            C::Aborted => "ABORTED",
            C::OutOfRange => "OUT_OF_RANGE",
            C::Unimplemented => "UNIMPLEMENTED",
            C::Internal => "INTERNAL",
            C::Unavailable => "UNAVAILABLE",
            C::DataLoss => "DATA_LOSS",
            C::Unauthenticated => "UNAUTHENTICATED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a plugin call failed: the plugin's share of the error table. Each
/// fault has its code and its label in `sluice_plugin_calls_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginFault {
    /// It ran past its time limit and was stopped.
    Timeout,
    /// It used up its fuel.
    OutOfFuel,
    /// It tried to grow its memory past its limit.
    OutOfMemory,
    /// Its stack overflowed (runaway recursion).
    StackOverflow,
    /// It trapped: a panic, an abort, an invalid operation.
    Trap,
    /// It refused the input it was given (the client's fault).
    InvalidInput,
    /// It reported an internal failure of its own.
    Failed,
    /// It returned tensors that do not match what it declared.
    BadOutput,
    /// No instance could be made for the call (the pool is exhausted).
    NoInstance,
}

impl PluginFault {
    /// The status a client gets.
    pub fn code(self) -> Code {
        match self {
            // The plugin overran the budget the operator gave it: a limit of
            // the server's, not the client's deadline.
            PluginFault::Timeout | PluginFault::OutOfFuel | PluginFault::OutOfMemory | PluginFault::NoInstance => {
                Code::ResourceExhausted
            }
            PluginFault::InvalidInput => Code::InvalidArgument,
            PluginFault::StackOverflow | PluginFault::Trap | PluginFault::Failed | PluginFault::BadOutput => {
                Code::Internal
            }
        }
    }

    /// The `outcome` label of plugin call metrics.
    pub fn label(self) -> &'static str {
        match self {
            PluginFault::Timeout => "timeout",
            PluginFault::OutOfFuel => "out_of_fuel",
            PluginFault::OutOfMemory => "out_of_memory",
            PluginFault::StackOverflow => "stack_overflow",
            PluginFault::Trap => "trap",
            PluginFault::InvalidInput => "invalid_input",
            PluginFault::Failed => "plugin_error",
            PluginFault::BadOutput => "bad_output",
            PluginFault::NoInstance => "no_instance",
        }
    }

    /// True when the instance that failed this way cannot be entered again.
    pub fn poisons_instance(self) -> bool {
        matches!(
            self,
            PluginFault::Timeout
                | PluginFault::OutOfFuel
                | PluginFault::OutOfMemory
                | PluginFault::StackOverflow
                | PluginFault::Trap
        )
    }
}

/// A failure anywhere in the runtime, by kind, with a message for the
/// client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Malformed or mismatched input: dtype, shape, names, empty request.
    #[error("{0}")]
    InvalidArgument(String),
    /// Unknown model, version, label, plugin or pipeline.
    #[error("{0}")]
    NotFound(String),
    /// The target cannot serve this request in its current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A bounded queue is full; the client may retry later.
    #[error("{queue} is full ({capacity} waiting); retry later or slow down")]
    QueueFull {
        /// Which queue ("the batch queue of model 'cnn' version 1").
        queue: String,
        /// How many it holds.
        capacity: usize,
    },
    /// A request asks for more than a limit allows (rows, bytes,
    /// elements); the message names the limit.
    #[error("{0}")]
    LimitExceeded(String),
    /// The request's deadline passed.
    #[error("deadline exceeded {at}; the request was not run")]
    DeadlineExceeded {
        /// Where the request was when it did.
        at: String,
    },
    /// The client gave up or went away.
    #[error("{0}")]
    Cancelled(String),
    /// A dependency, or the server itself, is down or shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// A dependency failed and reports its failures itself (a feature
    /// store's round trip, its circuit breaker open, every upstream
    /// ejected): UNAVAILABLE. The dependency logs them, once per outage
    /// or a line a second, so the requests they fail are counted, not
    /// each logged.
    #[error("{0}")]
    DependencyFailed(String),
    /// A broken invariant or a failure inside a model.
    #[error("{0}")]
    Internal(String),
    /// Not served by this server.
    #[error("{0}")]
    Unimplemented(String),
    /// The path exists, the method does not.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// No or unknown credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// Known caller, not allowed.
    #[error("{0}")]
    PermissionDenied(String),
    /// A change lost a race with another writer (another replica); nothing
    /// was changed, and a retry may succeed.
    #[error("{0}")]
    Aborted(String),
    /// The client sent its request too slowly (a slow-loris body).
    #[error("{0}")]
    TooSlow(String),
    /// A request body or message over the size limit.
    #[error("{0}")]
    TooLarge(String),
    /// Well-formed but refused on its content (an uploaded plugin).
    #[error("{0}")]
    Unprocessable(String),
    /// A plugin call failed.
    #[error("{message}{}", .detail.as_deref().map_or(String::new(), |d| format!(" (it said: {d})")))]
    Plugin {
        /// How.
        fault: PluginFault,
        /// What happened, naming the plugin and its version: the host's
        /// words, stable, for the client.
        message: String,
        /// The plugin's own words (a panic message with its source path,
        /// an internal error text): in the log, not in the client's
        /// answer, unless `[plugins] expose_plugin_errors`.
        detail: Option<String>,
    },
    /// The configuration is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A configuration error: which file and what is wrong in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, or `command line`.
    pub source: String,
    /// What is wrong, naming the key and the value.
    pub message: String,
}

// By hand: thiserror would take a field called `source` for the cause.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// What is wrong with one key of a configuration: the key, the value and
/// what is allowed. [`ConfigError`] adds the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl Invalid {
    /// The same problem, found in `source`.
    pub fn in_file(self, source: impl Into<String>) -> ConfigError {
        ConfigError { source: source.into(), message: self.0 }
    }
}

/// `Invalid(format!(…))`.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::error::Invalid(format!($($arg)*)) };
}

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Self {
        Error::InvalidArgument(invalid.0)
    }
}

impl Error {
    /// Malformed or mismatched input.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// Unknown model, version, label or plugin.
    pub fn not_found(message: impl Into<String>) -> Self {
        Error::NotFound(message.into())
    }

    /// The target cannot serve this request in its current state.
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Error::FailedPrecondition(message.into())
    }

    /// A bounded queue is full: names the queue and its capacity.
    pub fn queue_full(queue: &str, capacity: usize) -> Self {
        Error::QueueFull { queue: queue.to_string(), capacity }
    }

    /// A limit other than a queue is exhausted.
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Error::LimitExceeded(message.into())
    }

    /// The request's deadline passed; `at` says where it was when it did.
    pub fn deadline_exceeded(at: &str) -> Self {
        Error::DeadlineExceeded { at: at.to_string() }
    }

    /// A dependency or the server is not available.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable(message.into())
    }

    /// A dependency failed, and logs that itself.
    pub fn dependency_failed(message: impl Into<String>) -> Self {
        Error::DependencyFailed(message.into())
    }

    /// A failure inside the server or a model.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal(message.into())
    }

    /// Not served by this server.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Error::Unimplemented(message.into())
    }

    /// A plugin call failed in the way `fault` says.
    pub fn plugin(fault: PluginFault, message: impl Into<String>) -> Self {
        Error::Plugin { fault, message: message.into(), detail: None }
    }

    /// A plugin call failed, and the plugin said `detail` about it.
    pub fn plugin_said(fault: PluginFault, message: impl Into<String>, detail: Option<String>) -> Self {
        Error::Plugin { fault, message: message.into(), detail }
    }

    /// The status code: the one mapping from kinds to codes.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::QueueFull { .. } | Error::LimitExceeded(_) => Code::ResourceExhausted,
            Error::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            Error::Cancelled(_) => Code::Cancelled,
            Error::Unavailable(_) | Error::DependencyFailed(_) => Code::Unavailable,
            Error::Internal(_) => Code::Internal,
            Error::Unimplemented(_) => Code::Unimplemented,
            Error::MethodNotAllowed(_) => Code::MethodNotAllowed,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::Aborted(_) => Code::Aborted,
            Error::TooSlow(_) => Code::RequestTimeout,
            Error::TooLarge(_) => Code::TooLarge,
            Error::Unprocessable(_) => Code::Unprocessable,
            Error::Plugin { fault, .. } => fault.code(),
            Error::Config(_) => Code::InvalidArgument,
        }
    }

    /// The message for the client: everything [`Display`](fmt::Display)
    /// says (what the log gets), except a plugin's own words, which stay
    /// in the log under the request's id.
    pub fn message(&self) -> String {
        self.message_logged_under(format_args!("this request's id"))
    }

    /// [`Error::message`] for the answer to request `id`: a plugin's own
    /// words are in the log under that id, and the message gives it, so an
    /// author can find them without knowing where the id travels.
    pub fn message_for(&self, id: &str) -> String {
        self.message_logged_under(format_args!("request id {id}"))
    }

    /// The client's message, a plugin's own words replaced by where they
    /// are logged (`under`).
    fn message_logged_under(&self, under: fmt::Arguments<'_>) -> String {
        match self {
            Error::Plugin { message, detail: Some(_), .. } => {
                format!("{message} (what the plugin said is in the server log under {under})")
            }
            other => other.to_string(),
        }
    }

    /// The same error with `context` put in front of its message; the
    /// kind stays.
    pub fn context(self, context: impl fmt::Display) -> Self {
        let with = |message: String| format!("{context}: {message}");
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(with(m)),
            Error::NotFound(m) => Error::NotFound(with(m)),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(with(m)),
            Error::QueueFull { queue, capacity } => Error::QueueFull { queue: with(queue), capacity },
            Error::LimitExceeded(m) => Error::LimitExceeded(with(m)),
            Error::DeadlineExceeded { at } => Error::DeadlineExceeded { at: with(at) },
            Error::Cancelled(m) => Error::Cancelled(with(m)),
            Error::Unavailable(m) => Error::Unavailable(with(m)),
            Error::DependencyFailed(m) => Error::DependencyFailed(with(m)),
            Error::Internal(m) => Error::Internal(with(m)),
            Error::Unimplemented(m) => Error::Unimplemented(with(m)),
            Error::MethodNotAllowed(m) => Error::MethodNotAllowed(with(m)),
            Error::Unauthenticated(m) => Error::Unauthenticated(with(m)),
            Error::PermissionDenied(m) => Error::PermissionDenied(with(m)),
            Error::Aborted(m) => Error::Aborted(with(m)),
            Error::TooSlow(m) => Error::TooSlow(with(m)),
            Error::TooLarge(m) => Error::TooLarge(with(m)),
            Error::Unprocessable(m) => Error::Unprocessable(with(m)),
            Error::Plugin { fault, message, detail } => Error::Plugin { fault, message: with(message), detail },
            Error::Config(ConfigError { source, message }) => {
                Error::Config(ConfigError { source, message: with(message) })
            }
        }
    }

    /// This error as a refusal of an upload's content (422), keeping the
    /// message: a plugin that fails its checks is the uploader's problem,
    /// whatever the check found — except a limit of the server's own
    /// (one compilation at a time, the compile budget), which stays 429.
    pub fn into_unprocessable(self, context: impl fmt::Display) -> Self {
        match self {
            // The server was busy (another compilation, a compile over its
            // budget): a refusal to retry or resize, not a malformed plugin.
            Error::LimitExceeded(message) => Error::LimitExceeded(format!("{context}: {message}")),
            other => Error::Unprocessable(format!("{context}: {other}")),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        tonic::Status::new(error.code().grpc(), error.message())
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
            (Code::Aborted, 409),
            (Code::RequestTimeout, 408),
            (Code::ResourceExhausted, 429),
            (Code::Unimplemented, 501),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
            (Code::Internal, 500),
            (Code::TooLarge, 413),
            (Code::Unprocessable, 422),
            (Code::MethodNotAllowed, 405),
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

    #[test]
    fn context_keeps_the_kind() {
        let error = Error::queue_full("the queue", 3).context("pipeline 'p'");
        assert!(matches!(error, Error::QueueFull { capacity: 3, .. }));
        assert!(error.message().starts_with("pipeline 'p': the queue is full"), "{error}");
        let error = Error::plugin(PluginFault::Timeout, "plugin 'x' 1 ran too long").context("upload");
        assert_eq!(error.code(), Code::ResourceExhausted);
        assert!(matches!(error, Error::Plugin { fault: PluginFault::Timeout, .. }));
    }
}
