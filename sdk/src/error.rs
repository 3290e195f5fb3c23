//! The one error type every plugin returns.

use std::error::Error as StdError;

/// Boxed source error carried by [`PluginError::Failed`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a plugin could not do what it was asked.
///
/// A wrong answer is never an error: a verifier returns `Ok` with a zero reward. `Err` means the
/// plugin itself failed (bad config, broken backend, an operation it does not support).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The plugin does not implement an optional capability.
    #[error("{plugin}: `{operation}` is not supported")]
    Unsupported {
        /// Name of the plugin.
        plugin: String,
        /// The operation that was asked for.
        operation: &'static str,
    },
    /// A config value is missing or wrong; `key` is the full dotted path, e.g. `generator.top_p`.
    #[error("config key `{key}`: {message}")]
    Config {
        /// Full dotted path of the offending key.
        key: String,
        /// What is wrong with it, naming the bad value.
        message: String,
    },
    /// A plugin name that nothing registered.
    #[error("unknown {kind} plugin `{name}` at `{key}` (known: {})", known.join(", "))]
    UnknownPlugin {
        /// Which kind of plugin was asked for.
        kind: &'static str,
        /// The name given in the config.
        name: String,
        /// The config key that named it.
        key: String,
        /// Every registered name of that kind.
        known: Vec<String>,
    },
    /// The plugin refused a request as malformed (an input longer than the model's context, a
    /// token id outside its vocabulary, sampling parameters out of range): the caller's
    /// fault, which a server answers as a client error (HTTP 400, gRPC `INVALID_ARGUMENT`).
    #[error("{plugin}: {message}")]
    InvalidRequest {
        /// Name of the plugin.
        plugin: String,
        /// What is wrong with the request, naming the value.
        message: String,
    },
    /// The plugin ran and failed.
    #[error("{plugin}: {message}")]
    Failed {
        /// Name of the plugin.
        plugin: String,
        /// What went wrong.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

/// An error with its causes on one line (`what: why: deeper`), for a message that is passed on
/// as text (a server's status, a refusal another error quotes).
pub fn error_chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl PluginError {
    /// A failure of `plugin` described by `message`.
    pub fn failed(plugin: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Failed {
            plugin: plugin.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A failure of `plugin` caused by `source`.
    pub fn caused_by(
        plugin: impl Into<String>,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Failed {
            plugin: plugin.into(),
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An optional operation `operation` that `plugin` does not implement.
    pub fn unsupported(plugin: impl Into<String>, operation: &'static str) -> Self {
        Self::Unsupported {
            plugin: plugin.into(),
            operation,
        }
    }

    /// A bad config value at `key`.
    pub fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Config {
            key: key.into(),
            message: message.into(),
        }
    }

    /// A request `plugin` refuses as malformed ([`PluginError::InvalidRequest`]).
    pub fn invalid_request(plugin: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            plugin: plugin.into(),
            message: message.into(),
        }
    }

    /// An input of `tokens` tokens that does not fit `plugin`'s context of `context`: a
    /// request refused as the caller's fault ([`PluginError::InvalidRequest`]), in words that
    /// [`PluginError::exceeded_context`] reads back (on either side of a server too).
    pub fn context_exceeded(plugin: impl Into<String>, tokens: usize, context: usize) -> Self {
        Self::invalid_request(
            plugin,
            format!("input of {tokens} tokens does not fit the context of {context} tokens"),
        )
    }

    /// The input's tokens and the context, where this refuses an input past the model's
    /// context ([`PluginError::context_exceeded`], however many servers passed it on).
    pub fn exceeded_context(&self) -> Option<(usize, usize)> {
        let Self::InvalidRequest { message, .. } = self else {
            return None;
        };
        let (_, rest) = message.split_once("input of ")?;
        let (tokens, rest) = rest.split_once(" tokens does not fit the context of ")?;
        let (context, _) = rest.split_once(" tokens")?;
        Some((tokens.parse().ok()?, context.parse().ok()?))
    }

    /// Whether this is [`PluginError::Unsupported`].
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Self::Unsupported { .. })
    }

    /// Whether this is [`PluginError::InvalidRequest`]: the caller's fault.
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, Self::InvalidRequest { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::PluginError;

    #[test]
    fn an_input_past_the_context_is_read_back_through_servers() {
        let e = PluginError::context_exceeded("burn", 120, 64);
        assert!(e.is_invalid_request());
        assert_eq!(e.exceeded_context(), Some((120, 64)));
        // as a gRPC client rebuilds it from the server's status text
        let passed_on = PluginError::invalid_request("grpc", format!("generate: {e}"));
        assert_eq!(passed_on.exceeded_context(), Some((120, 64)));
        assert_eq!(
            PluginError::invalid_request("burn", "token id 9 is outside the vocabulary of 8")
                .exceeded_context(),
            None
        );
        assert_eq!(
            PluginError::failed("burn", e.to_string()).exceeded_context(),
            None
        );
    }
}
