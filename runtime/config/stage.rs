//! A pipeline stage's configuration: its workers and queue, and what it
//! does — exactly one kind, a built-in transform or a plugin
//! ([`StageKind`]). Config parsing, pipeline building and `config check`
//! all read this one type.

use std::path::PathBuf;

use serde::Deserialize;

/// Where in a pipeline a stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageRole {
    /// Between the client and the model.
    Preprocess,
    /// Between the model and the client.
    Postprocess,
}

impl StageRole {
    /// `preprocess` or `postprocess`: the key in the config.
    pub fn key(self) -> &'static str {
        match self {
            StageRole::Preprocess => "preprocess",
            StageRole::Postprocess => "postprocess",
        }
    }
}

/// What a stage does: one built-in transform or a plugin. This is the one
/// registry of stage kinds: a new built-in stage is a variant here (with
/// its config) and a file in `pipeline/stages/`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// Preprocess: u8 images to the model's normalised f32 input.
    ImageNormalize(ImageNormalizeConfig),
    /// Postprocess: softmax over classes.
    Softmax(ReduceConfig),
    /// Postprocess: the best class per row.
    Argmax(ReduceConfig),
    /// Postprocess: the k best classes per row, with scores and labels.
    TopK(TopKConfig),
    /// Pre- or postprocess: a WebAssembly plugin, by name (`NAME.wasm` in
    /// `[plugins] dir`, or its active uploaded version).
    Plugin(String),
    /// A graph step: the k rows with the highest score, of every tensor it
    /// reads (a cascade's shortlist).
    TopRows(TopRowsConfig),
    /// A graph step: rows of `values` picked by `indices`.
    Gather(GatherConfig),
    /// A graph step: a weighted sum of same-shaped scores (an ensemble).
    Blend(BlendConfig),
    /// A graph step: each item's dot product with a query (a two-tower).
    Dot(DotConfig),
    /// A graph step: tensors joined along their last dimension.
    Concat(ConcatConfig),
}

impl StageKind {
    /// Every kind, as the config spells it.
    pub const NAMES: &'static [&'static str] =
        &["image_normalize", "softmax", "argmax", "top_k", "plugin", "top_rows", "gather", "blend", "dot", "concat"];

    /// The key that selects it in the config.
    pub fn name(&self) -> &'static str {
        match self {
            StageKind::ImageNormalize(_) => "image_normalize",
            StageKind::Softmax(_) => "softmax",
            StageKind::Argmax(_) => "argmax",
            StageKind::TopK(_) => "top_k",
            StageKind::Plugin(_) => "plugin",
            StageKind::TopRows(_) => "top_rows",
            StageKind::Gather(_) => "gather",
            StageKind::Blend(_) => "blend",
            StageKind::Dot(_) => "dot",
            StageKind::Concat(_) => "concat",
        }
    }

    /// The kinds a stage in `role` may be.
    pub fn allowed_in(role: StageRole) -> &'static [&'static str] {
        match role {
            StageRole::Preprocess => &["image_normalize", "plugin"],
            StageRole::Postprocess => &["softmax", "argmax", "top_k", "plugin"],
        }
    }

    /// Files it names, so relative paths can be resolved from the config
    /// file's directory.
    pub fn paths_mut(&mut self) -> impl Iterator<Item = &mut PathBuf> {
        match self {
            StageKind::TopK(TopKConfig { labels: Some(labels), .. }) => Some(labels),
            _ => None,
        }
        .into_iter()
    }
}

/// One stage: its workers, its queue, and what it does.
///
/// The table holds `workers`, `queue_capacity` and exactly one kind key
/// (`top_k = { k = 5 }`, `plugin = "name"`); `Config::check` refuses a
/// table with none or several, naming the pipeline and the role.
#[derive(Debug, Clone)]
pub struct StageConfig {
    /// Worker threads.
    pub workers: usize,
    /// Requests that may wait for a worker; more are refused.
    pub queue_capacity: usize,
    /// Every kind key the table set; exactly one in a checked config.
    kinds: Vec<StageKind>,
}

impl StageConfig {
    /// A stage of `kind` with default workers and queue.
    pub fn new(kind: StageKind) -> StageConfig {
        StageConfig { workers: default_workers(), queue_capacity: default_stage_queue(), kinds: vec![kind] }
    }

    /// What the stage does; `None` unless exactly one kind was set (which
    /// `Config::check` guarantees for a loaded config).
    pub fn kind(&self) -> Option<&StageKind> {
        match self.kinds.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// The kind keys set, for the error that says there must be one.
    pub fn kind_names(&self) -> Vec<&'static str> {
        self.kinds.iter().map(StageKind::name).collect()
    }

    /// Files the stage names.
    pub fn paths_mut(&mut self) -> impl Iterator<Item = &mut PathBuf> {
        self.kinds.iter_mut().flat_map(StageKind::paths_mut)
    }
}

impl<'de> Deserialize<'de> for StageConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut table = toml::Table::deserialize(deserializer)?;
        let mut count = |key: &str, default: usize| -> Result<usize, D::Error> {
            match table.remove(key) {
                None => Ok(default),
                Some(toml::Value::Integer(n)) if n >= 0 => Ok(n as usize),
                Some(other) => Err(D::Error::custom(format!("{key} = {other}: expected a count (0 or more)"))),
            }
        };
        let workers = count("workers", default_workers())?;
        let queue_capacity = count("queue_capacity", default_stage_queue())?;
        let mut kinds = Vec::with_capacity(1);
        for (key, value) in table {
            if !StageKind::NAMES.contains(&key.as_str()) {
                return Err(D::Error::custom(format!(
                    "unknown key `{key}`; a stage takes workers, queue_capacity and one of {:?}",
                    StageKind::NAMES
                )));
            }
            let one = toml::Value::Table(toml::Table::from_iter([(key.clone(), value)]));
            let kind = StageKind::deserialize(one).map_err(|e| D::Error::custom(format!("{key}: {}", e.message())))?;
            kinds.push(kind);
        }
        Ok(StageConfig { workers, queue_capacity, kinds })
    }
}

fn default_workers() -> usize {
    1
}

fn default_stage_queue() -> usize {
    256
}

/// `image_normalize`: u8 images, rows × height × width × channels, into the
/// model's f32 rows × channels × height × width, resized (bilinear) to the
/// model's size when they differ, then `(x / scale − mean[c]) / std[c]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageNormalizeConfig {
    /// The input clients send.
    #[serde(default = "default_image_input")]
    pub input: String,
    /// Per-channel mean, after scaling.
    #[serde(default)]
    pub mean: Vec<f32>,
    /// Per-channel standard deviation, after scaling.
    #[serde(default)]
    pub std: Vec<f32>,
    /// Divides raw values first (255 maps bytes to 0..1).
    #[serde(default = "default_scale")]
    pub scale: f32,
}

fn default_image_input() -> String {
    "image".to_string()
}

fn default_scale() -> f32 {
    255.0
}

/// `softmax`, `argmax`: over the last axis of one model output.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReduceConfig {
    /// The model output to read; the model's only output when unset.
    pub input: Option<String>,
}

/// `top_k`: the k largest values of one model output per row, their class
/// indexes, and optionally their labels.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopKConfig {
    /// The model output to read; the model's only output when unset.
    pub input: Option<String>,
    /// How many to return.
    pub k: usize,
    /// Apply softmax first, so scores are probabilities.
    #[serde(default)]
    pub softmax: bool,
    /// A text file with one label per class, in class order.
    pub labels: Option<PathBuf>,
}

/// `top_rows`: scores one row each (`by`, shape `[N]` or `[N, 1]`); every
/// tensor the step reads comes out with only its `k` best rows, best
/// first, and `indices` says which rows they were.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopRowsConfig {
    /// How many rows to keep (fewer when fewer come).
    pub k: usize,
    /// The input holding each row's score.
    pub by: String,
}

/// `gather`: the rows of `values` whose indexes `indices` holds, in its
/// order.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatherConfig {}

/// `blend`: `blended = Σ weight × input` over its inputs, which share one
/// shape.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlendConfig {
    /// Each input's weight, by its name in the step.
    pub weights: std::collections::BTreeMap<String, f32>,
}

/// `dot`: `scores[i] = query · items[i]`, with `query` one row (shared by
/// every item) or one row per item.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DotConfig {}

/// `concat`: its inputs, in this order, joined along the last dimension
/// into `joined`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcatConfig {
    /// The inputs, by their names in the step, in the order they join.
    pub order: Vec<String>,
}
