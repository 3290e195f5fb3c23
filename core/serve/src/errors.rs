//! The errors of the clients of servers: a bad option, an endpoint that cannot be reached as
//! written, a fleet that lends no server, a sample that got no answer. Each keeps its cause as
//! a source; plugins turn them into a [`PluginError`](areal_sdk::PluginError) with it.

use std::error::Error;

/// A bad option of a remote plugin: its key and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct OptionError {
    /// The key at fault (`endpoints`, `grace_s`...).
    pub key: &'static str,
    /// What is wrong with it.
    pub message: String,
    /// What failed underneath, if anything.
    #[source]
    pub source: Option<Box<dyn Error + Send + Sync>>,
}

impl OptionError {
    /// `key` is wrong: `message`.
    pub(crate) fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self {
            key,
            message: message.into(),
            source: None,
        }
    }

    /// `key` is wrong: `message`, because of `source`.
    pub(crate) fn caused(
        key: &'static str,
        message: impl Into<String>,
        source: impl Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            key,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The message with its causes, on one line, as a config error shows it.
    pub(crate) fn explained(&self) -> String {
        match &self.source {
            Some(source) => format!("{}: {}", self.message, crate::error_chain(source.as_ref())),
            None => self.message.clone(),
        }
    }
}

/// An endpoint a client cannot reach as written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EndpointError {
    #[error("endpoint {url:?} must start with http:// or https://")]
    Scheme { url: String },
    #[error("endpoint {url:?} has no host")]
    NoHost { url: String },
    #[error("endpoint {url:?} is https: give tls_ca_file, the certificate authority of its server")]
    NeedsAuthority { url: String },
    #[error("endpoint {url:?}")]
    Invalid {
        url: String,
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
}

impl From<EndpointError> for OptionError {
    fn from(e: EndpointError) -> Self {
        match e {
            EndpointError::Invalid { url, source } => Self {
                key: "endpoints",
                message: format!("endpoint {url:?}"),
                source: Some(source),
            },
            other => Self::new("endpoints", other.to_string()),
        }
    }
}

/// Why a fleet lends no server.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum FleetError {
    /// None has taken work for the grace period: for good.
    #[error(
        "no {kind} server has taken work for {seconds:.0} s (the grace period{}): {report}",
        if *with_load { " and one weight load's time" } else { "" }
    )]
    Gone {
        kind: &'static str,
        seconds: f64,
        /// The period was lengthened by a weight load's time.
        with_load: bool,
        /// Every endpoint with what it last said.
        report: String,
    },
    /// Every one refused us for good (a wrong token, another protocol).
    #[error("every {kind} server refuses us: {report}")]
    AllRefuse { kind: &'static str, report: String },
}

/// Why one sample got no answer from a fleet, after the failures on the way.
#[derive(Debug, thiserror::Error)]
#[error("sample {sample_id}: {why}{}", after(failures))]
pub(crate) struct SampleError {
    pub(crate) sample_id: u64,
    pub(crate) why: SampleFailure,
    /// The servers that failed with it before (`url: what it said`).
    pub(crate) failures: Vec<String>,
}

fn after(failures: &[String]) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!(" after {}", failures.join("; "))
    }
}

/// What ended a sample's attempts.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SampleFailure {
    /// The fleet lends no server.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// A server answered no: the same request would fail anywhere.
    #[error("{url} refused: {refusal}")]
    Refused { url: String, refusal: CallError },
    /// A server failed with it, and then another.
    #[error("no {kind} server answered ({})", tried.join("; "))]
    NoneAnswered {
        kind: &'static str,
        tried: Vec<String>,
    },
    /// The client stopped before the answer came.
    #[error("the client has stopped")]
    Stopped,
}

/// How a failed call is taken.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The server is dead, unreachable or too slow: take it out and send the work elsewhere.
    #[error("{0}")]
    Fault(String),
    /// The server answered and refused (the plugin failed, a malformed request): sending the
    /// same work elsewhere would fail the same way.
    #[error("{0}")]
    Refused(String),
    /// The server cannot do this at all (an API without the call): neither a fault nor a
    /// refusal of this request.
    #[error("cannot {0}")]
    Unsupported(&'static str),
}

impl CallError {
    /// Classify a status: transport failures and time-outs are the server's fault; what a
    /// server says on purpose is a refusal.
    pub(crate) fn from_status(status: &tonic::Status) -> Self {
        use tonic::Code;
        let said = describe(status);
        match status.code() {
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Unauthenticated
            | Code::PermissionDenied
            | Code::Unimplemented
            | Code::OutOfRange
            | Code::Aborted
            | Code::NotFound
            | Code::AlreadyExists => Self::Refused(said),
            _ => Self::Fault(said),
        }
    }
}

/// A status as a short phrase for logs and errors.
fn describe(status: &tonic::Status) -> String {
    match status.code() {
        tonic::Code::Unavailable => format!("unreachable ({})", status.message()),
        tonic::Code::DeadlineExceeded => "no answer in time".into(),
        code => format!("{code:?}: {}", status.message()),
    }
}
