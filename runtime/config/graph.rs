//! A pipeline of several steps: the `steps`, `inputs` and `outputs` keys of
//! a `[[pipelines]]` table, and the checks that need no model loaded —
//! names, references, cycles ([`check_graph`]). What needs the models'
//! and plugins' signatures (dtypes and shapes between steps) is checked
//! when the graph is built (`pipeline/graph`), by the server and by
//! `sluice config check` alike.
//!
//! Every step's outputs are tensors of the graph named `STEP.OUTPUT`; a
//! step's `outputs` table renames some of them (`{ score = "coarse_score" }`).
//! A step reads each of its inputs from the graph tensor its `inputs` table
//! names, or, when the table does not name it, from the tensor of the same
//! name: a graph input, a renamed output or a fetched feature.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Deserialize;

use super::stage::{StageConfig, StageKind};
use super::{check_name, FeatureFetchConfig, Invalid};
use crate::invalid;
use sluice_sdk::DType;

/// A tensor clients send a graph pipeline: its name, and its dtype and
/// shape when no model or plugin step reading it says them (a built-in
/// takes any): `"candidates"` or `{ name = "item_ids", dtype = "int64",
/// shape = [-1] }`.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphInput {
    /// The name clients use.
    pub name: String,
    /// Its dtype and shape, when declared.
    pub spec: Option<(DType, Vec<i64>)>,
}

impl<'de> Deserialize<'de> for GraphInput {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Declared {
            name: String,
            #[serde(deserialize_with = "super::features::dtype_by_name")]
            dtype: DType,
            shape: Vec<i64>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Name(String),
            Declared(Declared),
        }
        match Raw::deserialize(deserializer).map_err(|_| {
            serde::de::Error::custom(
                "an input is a name (\"candidates\") or { name = \"...\", dtype = \"int64\", shape = [-1] }",
            )
        })? {
            Raw::Name(name) => Ok(GraphInput { name, spec: None }),
            Raw::Declared(d) => Ok(GraphInput { name: d.name, spec: Some((d.dtype, d.shape)) }),
        }
    }
}

/// One step of a graph pipeline.
#[derive(Debug, Clone)]
pub struct StepConfig {
    /// Unique in its pipeline; its outputs are `NAME.OUTPUT`.
    pub name: String,
    /// What it runs.
    pub action: StepAction,
    /// The step's input name → the graph tensor it reads.
    pub inputs: BTreeMap<String, String>,
    /// The step's output name → the name its tensor takes in the graph.
    pub outputs: BTreeMap<String, String>,
    /// Runs only when this tensor is all true (non-zero).
    pub when: Option<String>,
    /// Runs only when this tensor is not all true.
    pub unless: Option<String>,
}

/// What a step runs.
#[derive(Debug, Clone)]
pub enum StepAction {
    /// A served model, through its own batcher and admission of rows.
    Model(ModelStep),
    /// A built-in transform or a plugin, on its own workers.
    Stage(StageConfig),
}

/// A model step: which model, and which of its versions.
#[derive(Debug, Clone)]
pub struct ModelStep {
    /// The model's name.
    pub model: String,
    /// A version number; unset: the version the request chose when this is
    /// the pipeline's model, else the model's latest.
    pub version: Option<i64>,
    /// A version label of the model, instead of a number.
    pub version_label: Option<String>,
}

impl StepConfig {
    /// The condition it waits on: the tensor and whether it must be true.
    pub fn condition(&self) -> Option<(&str, bool)> {
        self.when.as_deref().map(|t| (t, true)).or_else(|| self.unless.as_deref().map(|t| (t, false)))
    }

    /// The model it runs, when it is a model step.
    pub fn model(&self) -> Option<&ModelStep> {
        match &self.action {
            StepAction::Model(step) => Some(step),
            StepAction::Stage(_) => None,
        }
    }

    /// The stage it runs, when it is not a model step.
    pub fn stage(&self) -> Option<&StageConfig> {
        match &self.action {
            StepAction::Stage(stage) => Some(stage),
            StepAction::Model(_) => None,
        }
    }

    /// The graph name of its output `output`.
    pub fn output_name(&self, output: &str) -> String {
        self.outputs.get(output).cloned().unwrap_or_else(|| format!("{}.{output}", self.name))
    }

    /// The graph tensor its input `input` reads.
    pub fn input_source<'a>(&'a self, input: &'a str) -> &'a str {
        self.inputs.get(input).map_or(input, String::as_str)
    }
}

impl<'de> Deserialize<'de> for StepConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut table = toml::Table::deserialize(deserializer)?;
        let string = |table: &mut toml::Table, key: &str| -> Result<Option<String>, D::Error> {
            match table.remove(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s)),
                Some(other) => Err(D::Error::custom(format!("{key} = {other}: expected a string"))),
            }
        };
        let map = |table: &mut toml::Table, key: &str| -> Result<BTreeMap<String, String>, D::Error> {
            match table.remove(key) {
                None => Ok(BTreeMap::new()),
                Some(value) => BTreeMap::<String, String>::deserialize(value).map_err(|e| {
                    D::Error::custom(format!(
                        "{key}: {}; expected a table of names, e.g. {{ x = \"tensor\" }}",
                        e.message()
                    ))
                }),
            }
        };
        let name = string(&mut table, "name")?.ok_or_else(|| D::Error::custom("a step needs a `name`"))?;
        let inputs = map(&mut table, "inputs")?;
        let outputs = map(&mut table, "outputs")?;
        let when = string(&mut table, "when")?;
        let unless = string(&mut table, "unless")?;
        let model = string(&mut table, "model")?;
        let version_label = string(&mut table, "version_label")?;
        let version = match table.remove("version") {
            None => None,
            Some(toml::Value::Integer(n)) => Some(n),
            Some(other) => return Err(D::Error::custom(format!("version = {other}: expected a version number"))),
        };
        let action = match model {
            Some(model) => {
                if let Some(key) = table.keys().next() {
                    return Err(D::Error::custom(format!(
                        "step '{name}': `{key}` with `model`; a step runs one model or one stage, not both"
                    )));
                }
                StepAction::Model(ModelStep { model, version, version_label })
            }
            None => {
                if version.is_some() || version_label.is_some() {
                    return Err(D::Error::custom(format!(
                        "step '{name}': version and version_label choose a model's version; the step runs no model"
                    )));
                }
                let stage = StageConfig::deserialize(toml::Value::Table(table))
                    .map_err(|e| D::Error::custom(format!("step '{name}': {}", e.message())))?;
                StepAction::Stage(stage)
            }
        };
        Ok(StepConfig { name, action, inputs, outputs, when, unless })
    }
}

/// The stage kinds a step may run (`image_normalize` writes a model's own
/// input, so it belongs before one model, not in a graph).
pub const STEP_KINDS: &[&str] =
    &["softmax", "argmax", "top_k", "top_rows", "gather", "blend", "dot", "concat", "plugin"];

/// What produces one graph tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Input,
    Fetch,
    Step(usize),
}

/// Checks a graph pipeline's structure: step names, one action each,
/// every tensor read or returned made by something (a graph input, the
/// feature fetch, or a step), no tensor written twice unless by steps that
/// run on opposite conditions, and no cycle. `key` is the pipeline's key
/// (`pipelines[2]`), `lead` its `model`, `models` the names served.
pub fn check_graph(
    key: &str,
    lead: &str,
    inputs: &[GraphInput],
    outputs: &[String],
    steps: &[StepConfig],
    fetch: Option<&FeatureFetchConfig>,
    models: &HashSet<&str>,
) -> Result<(), Invalid> {
    if inputs.is_empty() {
        return Err(invalid!(
            "{key}.inputs: a pipeline with steps lists the tensors clients send, e.g. inputs = [\"candidates\"]"
        ));
    }
    if outputs.is_empty() {
        return Err(invalid!(
            "{key}.outputs: a pipeline with steps lists the tensors it returns, e.g. outputs = [\"scores\"]"
        ));
    }
    let mut made: HashMap<String, Vec<Source>> = HashMap::new();
    for input in inputs {
        check_name(&format!("{key}.inputs"), &input.name)?;
        if made.insert(input.name.clone(), vec![Source::Input]).is_some() {
            return Err(invalid!("{key}.inputs: \"{}\" is listed twice", input.name));
        }
        if let Some((_, shape)) = &input.spec {
            if shape.iter().any(|&d| d < -1) {
                return Err(invalid!(
                    "{key}.inputs: \"{}\" has shape {shape:?}; dimensions are sizes or -1 (any)",
                    input.name
                ));
            }
        }
    }
    if let Some(fetch) = fetch {
        for lookup in &fetch.lookups {
            for feature in &lookup.features {
                made.entry(feature.tensor_name().to_string()).or_default().push(Source::Fetch);
            }
        }
        // True when a lookup fell back on `on_store_error`: a fallback
        // step's condition (pipeline::fetch::FELL_BACK).
        made.entry("feature_fetch.fell_back".to_string()).or_default().push(Source::Fetch);
        // Each lookup's keys are a graph input or what an earlier one made.
        for (l, lookup) in fetch.lookups.iter().enumerate() {
            let earlier = fetch.lookups[..l].iter().flat_map(|e| &e.features).any(|f| f.tensor_name() == lookup.keys);
            if !earlier && !inputs.iter().any(|i| i.name == lookup.keys) {
                return Err(invalid!(
                    "{key}.feature_fetch.lookups[{l}].keys = \"{}\": not among the graph's inputs; list it in {key}.inputs",
                    lookup.keys
                ));
            }
        }
    }
    let mut names = BTreeSet::new();
    let mut leads = false;
    for (i, step) in steps.iter().enumerate() {
        let step_key = format!("{key}.steps[{i}]");
        check_name(&format!("{step_key}.name"), &step.name)?;
        if step.name.contains('.') {
            return Err(invalid!(
                "{step_key}.name = \"{}\": a step's name may not contain '.', which separates it from its outputs' names",
                step.name
            ));
        }
        if !names.insert(step.name.as_str()) {
            return Err(invalid!("{step_key}.name = \"{}\": another step has the same name", step.name));
        }
        if step.when.is_some() && step.unless.is_some() {
            return Err(invalid!("{step_key}: set `when` or `unless`, not both"));
        }
        match &step.action {
            StepAction::Model(model) => {
                if !models.contains(model.model.as_str()) {
                    let known: BTreeSet<&str> = models.iter().copied().collect();
                    return Err(invalid!("{step_key}.model = \"{}\": no such model; models: {known:?}", model.model));
                }
                if model.version.is_some() && model.version_label.is_some() {
                    return Err(invalid!("{step_key}: set version or version_label, not both"));
                }
                if let Some(version) = model.version.filter(|v| *v < 0) {
                    return Err(invalid!("{step_key}.version = {version}: expected a version number (0 or more)"));
                }
                // The step that runs the pipeline's model at the version the
                // request chose; a pinned one would ignore that choice.
                leads |= model.model == lead && model.version.is_none() && model.version_label.is_none();
            }
            StepAction::Stage(stage) => {
                let chosen = stage.kind_names();
                if chosen.len() != 1 || !STEP_KINDS.contains(&chosen[0]) {
                    return Err(invalid!(
                        "{step_key}: set `model` or exactly one of {STEP_KINDS:?} (found {chosen:?})"
                    ));
                }
                if stage.workers == 0 || stage.queue_capacity == 0 {
                    return Err(invalid!("{step_key}: workers and queue_capacity must be at least 1"));
                }
                super::check_at_most(&format!("{step_key}.workers"), stage.workers, super::MAX_THREADS)?;
                super::check_at_most(&format!("{step_key}.queue_capacity"), stage.queue_capacity, super::MAX_COUNT)?;
                if let Some(StageKind::Plugin(plugin)) = stage.kind() {
                    check_name(&format!("{step_key}.plugin"), plugin)?;
                }
            }
        }
        for (output, renamed) in &step.outputs {
            if renamed.is_empty() {
                return Err(invalid!("{step_key}.outputs.{output} = \"\": name the tensor it becomes"));
            }
            made.entry(renamed.clone()).or_default().push(Source::Step(i));
        }
    }
    // `STEP.` names are the steps' own: an input, a feature or a rename
    // there would share a slot with a step's output.
    for name in made.keys() {
        if let Some((prefix, _)) = name.split_once('.') {
            let owner = if prefix == "feature_fetch" && fetch.is_some() { None } else { Some(prefix) };
            if let Some(step) = owner.filter(|p| steps.iter().any(|s| s.name == *p)) {
                return Err(invalid!(
                    "{key}: the tensor name '{name}' is in step '{step}'s own names (its outputs are '{step}.OUTPUT'); \
                     choose a name that does not start with '{step}.'"
                ));
            }
        }
    }
    if fetch.is_some() && steps.iter().any(|s| s.name == "feature_fetch") {
        return Err(invalid!(
            "{key}.steps: 'feature_fetch' names the feature fetch's own tensors; name the step otherwise"
        ));
    }
    if !leads {
        return Err(invalid!(
            "{key}.model = \"{lead}\": no step runs it without a version or version_label of its own; a pipeline \
             with steps names, in `model`, the model step whose versions clients choose"
        ));
    }
    for (tensor, sources) in &made {
        if sources.len() < 2 {
            continue;
        }
        // Two writers are a switch only when they run on opposite
        // conditions on one tensor: then exactly one of them runs.
        let conditions: Vec<Option<(&str, bool)>> = sources
            .iter()
            .map(|s| match s {
                Source::Step(i) => steps[*i].condition(),
                _ => None,
            })
            .collect();
        let switch = conditions.len() == 2
            && matches!((conditions[0], conditions[1]), (Some((a, x)), Some((b, y))) if a == b && x != y);
        if !switch {
            let writers: Vec<String> = sources
                .iter()
                .map(|s| match s {
                    Source::Input => "the graph's inputs".to_string(),
                    Source::Fetch => "the feature fetch".to_string(),
                    Source::Step(i) => format!("step '{}'", steps[*i].name),
                })
                .collect();
            return Err(invalid!(
                "{key}: tensor '{tensor}' is made by {}; only two steps with opposite conditions on one tensor \
                 (`when = \"x\"` and `unless = \"x\"`) may make the same tensor",
                writers.join(" and ")
            ));
        }
    }
    // Who each step waits for: the makers of what it reads.
    let known = |tensor: &str| -> Result<Vec<usize>, String> {
        if let Some(sources) = made.get(tensor) {
            return Ok(sources.iter().filter_map(|s| if let Source::Step(i) = s { Some(*i) } else { None }).collect());
        }
        if let Some((step, _)) = tensor.split_once('.') {
            if let Some(i) = steps.iter().position(|s| s.name == step) {
                return Ok(vec![i]);
            }
        }
        let mut names: Vec<&str> = made.keys().map(String::as_str).collect();
        names.sort_unstable();
        Err(format!(
            "'{tensor}' is not a tensor of the graph: not an input, a fetched feature, a renamed output or \
             STEP.OUTPUT of a step; tensors: {names:?} and each step's STEP.OUTPUT"
        ))
    };
    let mut waits: Vec<BTreeSet<usize>> = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let mut before = BTreeSet::new();
        for (input, source) in &step.inputs {
            before.extend(known(source).map_err(|e| invalid!("{key}.steps[{i}].inputs.{input}: {e}"))?);
        }
        if let Some((tensor, _)) = step.condition() {
            before.extend(known(tensor).map_err(|e| invalid!("{key}.steps[{i}] ({}) condition: {e}", step.name))?);
        }
        waits.push(before);
    }
    for (i, output) in outputs.iter().enumerate() {
        known(output).map_err(|e| invalid!("{key}.outputs: {e}"))?;
        if outputs[..i].contains(output) {
            return Err(invalid!("{key}.outputs: \"{output}\" is listed twice"));
        }
    }
    // Kahn's order: what is left when no step is ready is a cycle.
    let mut done = vec![false; steps.len()];
    loop {
        let ready: Vec<usize> =
            (0..steps.len()).filter(|&i| !done[i] && waits[i].iter().all(|&w| done[w] && w != i)).collect();
        if ready.is_empty() {
            break;
        }
        ready.into_iter().for_each(|i| done[i] = true);
    }
    let stuck: Vec<&str> = steps.iter().zip(&done).filter(|(_, d)| !**d).map(|(s, _)| s.name.as_str()).collect();
    if !stuck.is_empty() {
        return Err(invalid!(
            "{key}.steps: a cycle: steps {stuck:?} each wait, through what they read, for another of them"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(text: &str) -> Vec<StepConfig> {
        #[derive(Deserialize)]
        struct Steps {
            steps: Vec<StepConfig>,
        }
        toml::from_str::<Steps>(text).expect("steps parse").steps
    }

    fn check(inputs: &[&str], outputs: &[&str], text: &str) -> Result<(), Invalid> {
        let inputs: Vec<GraphInput> = inputs.iter().map(|s| GraphInput { name: s.to_string(), spec: None }).collect();
        let outputs: Vec<String> = outputs.iter().map(|s| s.to_string()).collect();
        check_graph("pipelines[0]", "fine", &inputs, &outputs, &steps(text), None, &HashSet::from(["coarse", "fine"]))
    }

    const CASCADE: &str = r#"
        [[steps]]
        name = "coarse"
        model = "coarse"
        inputs = { features = "candidates" }
        [[steps]]
        name = "top"
        top_rows = { k = 4, by = "score" }
        inputs = { score = "coarse.score", features = "candidates" }
        [[steps]]
        name = "fine"
        model = "fine"
        inputs = { features = "top.features" }
        outputs = { score = "scores" }
    "#;

    #[test]
    fn a_cascade_passes() {
        check(&["candidates"], &["scores", "top.indices"], CASCADE).expect("valid cascade");
    }

    #[test]
    fn unknown_tensors_are_named() {
        let e = check(&["candidates"], &["scorez"], CASCADE).unwrap_err().0;
        assert!(e.contains("'scorez' is not a tensor of the graph") && e.contains("scores"), "{e}");
        let e = check(&["candidate"], &["scores"], CASCADE).unwrap_err().0;
        assert!(e.contains("steps[0].inputs.features") && e.contains("'candidates'"), "{e}");
    }

    #[test]
    fn cycles_are_refused_naming_the_steps() {
        let text = r#"
            [[steps]]
            name = "a"
            model = "fine"
            inputs = { x = "b.y" }
            [[steps]]
            name = "b"
            model = "coarse"
            inputs = { x = "a.y" }
        "#;
        let e = check(&["x"], &["a.y"], text).unwrap_err().0;
        assert!(e.contains("cycle") && e.contains("\"a\"") && e.contains("\"b\""), "{e}");
    }

    #[test]
    fn a_name_in_a_steps_own_names_is_refused() {
        let text = r#"
            [[steps]]
            name = "coarse"
            model = "coarse"
            [[steps]]
            name = "fine"
            model = "fine"
            inputs = { features = "coarse.score" }
            outputs = { score = "coarse.score" }
        "#;
        let e = check(&["features"], &["fine.score"], text).unwrap_err().0;
        assert!(e.contains("'coarse.score' is in step 'coarse's own names"), "{e}");
        let e = check(&["coarse.x"], &["fine.score"], CASCADE).unwrap_err().0;
        assert!(e.contains("'coarse.x'"), "{e}");
    }

    #[test]
    fn the_lead_step_may_not_pin_its_version() {
        let text = "[[steps]]\nname = \"a\"\nmodel = \"fine\"\nversion = 2\n";
        let e = check(&["x"], &["a.y"], text).unwrap_err().0;
        assert!(e.contains("without a version or version_label"), "{e}");
    }

    #[test]
    fn two_writers_must_be_a_switch() {
        let clash = r#"
            [[steps]]
            name = "a"
            model = "fine"
            outputs = { y = "out" }
            [[steps]]
            name = "b"
            model = "coarse"
            outputs = { y = "out" }
        "#;
        let e = check(&["x"], &["out"], clash).unwrap_err().0;
        assert!(e.contains("'out' is made by step 'a' and step 'b'"), "{e}");
        let switch = r#"
            [[steps]]
            name = "a"
            model = "fine"
            when = "x"
            outputs = { y = "out" }
            [[steps]]
            name = "b"
            model = "coarse"
            unless = "x"
            outputs = { y = "out" }
        "#;
        check(&["x"], &["out"], switch).expect("a switch is two writers on opposite conditions");
    }

    #[test]
    fn steps_name_one_action_and_the_lead_model_runs() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Steps {
            steps: Vec<StepConfig>,
        }
        let both = toml::from_str::<Steps>("[[steps]]\nname = \"a\"\nmodel = \"fine\"\nsoftmax = {}\n").unwrap_err();
        assert!(both.to_string().contains("runs one model or one stage"), "{both}");
        let text = "[[steps]]\nname = \"a\"\nmodel = \"coarse\"\n";
        let e = check(&["x"], &["a.y"], text).unwrap_err().0;
        assert!(e.contains("no step runs it"), "{e}");
        let text = "[[steps]]\nname = \"a\"\nmodel = \"fine\"\n[[steps]]\nname = \"n\"\nimage_normalize = {}\n";
        let e = check(&["x"], &["a.y"], text).unwrap_err().0;
        assert!(e.contains("exactly one of") && e.contains("image_normalize"), "{e}");
    }
}
