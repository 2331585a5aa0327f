//! The library's one error type. Every variant names the thing at fault:
//! the file, the tensor, the config field, the position.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The cause is part of the message (not a `source`), so that error
    // chains print it once.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },

    #[error("{path}: invalid JSON: {err}")]
    Json { path: PathBuf, err: serde_json::Error },

    /// A `config.json` field is missing, has the wrong type, or an
    /// impossible value.
    #[error("config.json: field `{field}`: {msg}")]
    Config { field: String, msg: String },

    #[error("unsupported model_type `{model_type}`; supported: {supported}")]
    UnsupportedArch { model_type: String, supported: String },

    /// A file whose contents do not match what its format promises
    /// (truncated, corrupt header, entry past the end).
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },

    #[error("tensor `{name}` not found{}", where_.as_ref().map(|w| format!(" in {w}")).unwrap_or_default())]
    MissingTensor { name: String, where_: Option<String> },

    #[error("tensor `{name}`: expected shape {expected:?}, found {found:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    #[error("tensor `{name}`: unsupported dtype {dtype}")]
    Dtype { name: String, dtype: String },

    /// A GGUF tensor in a block format moeflux has no kernels for.
    #[error("{}: tensor `{tensor}` is {ty}, a GGUF block format moeflux cannot compute with (it can: {supported}); convert the model with `--requantize BITS`", path.display())]
    GgufType {
        path: PathBuf,
        tensor: String,
        ty: String,
        supported: &'static str,
    },

    #[error("token id {token} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },

    #[error("evaluation at position {got}, but the session holds {expected} positions (positions must be contiguous)")]
    Position { expected: usize, got: usize },

    #[error("context full: position {pos} exceeds the limit of {limit}")]
    ContextFull { pos: usize, limit: usize },

    /// `truncate` on a model with recurrent layers found no checkpoint at or
    /// below the position (and the tokens to re-evaluate are not known).
    #[error("cannot truncate to {pos}: the model has recurrent layers and no checkpoint at or below {pos} covers it (store checkpoints with Session::checkpoint)")]
    NoCheckpoint { pos: usize },

    #[error("no checkpoint at position {0}")]
    CheckpointMissing(usize),

    /// An evaluation failed part-way on a model with recurrent state; the
    /// session must be cleared, restored or reloaded before it is used again.
    #[error(
        "the session's recurrent state is incomplete after an earlier error; clear, restore or load a state first"
    )]
    SessionBroken,

    /// Converting a checkpoint failed for a reason not covered above.
    #[error("convert: {0}")]
    Convert(String),

    /// The destination exists and `--force` was not given.
    #[error("{0} already exists (use --force to overwrite)")]
    Exists(PathBuf),

    /// A checkpoint as downloaded where a packed model was expected.
    #[error("{} is a checkpoint as downloaded, not a packed model: convert it first, e.g. `moeflux convert {} {}-moeflux`, then give the new directory", .0.display(), .0.display(), .0.display())]
    SourceCheckpoint(PathBuf),

    /// Stopped by the caller's cancel flag (Ctrl-C); nothing was left behind.
    #[error("interrupted; the partly written output was removed")]
    Cancelled,

    #[error("invalid argument: {0}")]
    Invalid(String),

    /// A grammar (JSON schema, Lark) that cannot constrain generation:
    /// it does not compile, or the tokenizer's vocabulary cannot be read
    /// as bytes.
    #[error("grammar: {0}")]
    Grammar(String),

    /// The HTTP server could not start or stopped on an I/O error.
    #[error("server: {0}")]
    Server(String),

    /// A step's numbers went bad: logits that are all NaN or −∞, or (with
    /// `Model::set_check_nan`) a layer whose output holds a NaN.
    #[error("numeric failure: {0}")]
    Numeric(String),
    /// The Hub refused a gated or private repo (HTTP 401/403).
    #[error("{repo}: access denied (HTTP {status}): the model is gated or private; accept its terms at {url} and give a token (HF_TOKEN, or `huggingface-cli login`)")]
    HubDenied { repo: String, status: u16, url: String },

    /// A repo, revision or file the Hub does not have.
    #[error("{0}: not found on the Hub")]
    HubNotFound(String),

    /// Offline (`HF_HUB_OFFLINE`) and the cache lacks what is needed.
    #[error("{repo}: {msg}, and the Hub may not be asked (HF_HUB_OFFLINE is set): pull it once online")]
    HubOffline { repo: String, msg: String },

    /// A download that failed: the network, the server, or a file that
    /// does not match the Hub's size or sha256.
    #[error("hub: {0}")]
    Hub(String),

    #[error("backend {backend}: {msg}")]
    Backend { backend: &'static str, msg: String },
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            err: source,
        }
    }
    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }
    pub fn config(field: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Config {
            field: field.into(),
            msg: msg.into(),
        }
    }
    pub fn missing(name: impl Into<String>) -> Self {
        Error::MissingTensor {
            name: name.into(),
            where_: None,
        }
    }
}

/// Read and parse a JSON file with errors naming the path.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        err: e,
    })
}
