//! The built-ins that join models in a graph pipeline: `top_rows` (a
//! cascade's shortlist), `gather` (rows by index), `blend` (an ensemble's
//! weighted scores), `dot` (a two-tower's scores) and `concat` (features
//! side by side).
//!
//! Each is built from what its step reads (`reads`, named as in the step)
//! and checks every tensor it is given at run time too: what reaches it
//! was made by a model or a plugin, and a graph's rows are only known
//! when a request runs.

use bytes::Bytes;

use crate::config::stage::{BlendConfig, ConcatConfig, TopRowsConfig};
use crate::error::{Error, Result};
use crate::pipeline::stage::{Stage, StageCx, StageIo};
use crate::tensor::spec::TensorSpec;
use crate::tensor::{format_shape, tensor_bytes, DType, NamedTensor, Tensor, TensorData};

/// The rows of `tensor` at `rows`, in that order (one copy).
pub fn take_rows(tensor: &Tensor, rows: &[usize], name: &str) -> Result<Tensor> {
    let total = tensor.shape().first().copied().unwrap_or(0).max(0) as usize;
    if let Some(&bad) = rows.iter().find(|&&r| r >= total) {
        return Err(Error::invalid_argument(format!(
            "row {bad} of '{name}' was asked for, but it has {total} rows (shape {})",
            format_shape(tensor.shape())
        )));
    }
    let per_row = tensor.len().checked_div(total).unwrap_or(0);
    let mut shape = tensor.shape().to_vec();
    shape[0] = rows.len() as i64;
    let data = match tensor.data() {
        TensorData::Fixed(bytes) => {
            let row_bytes = per_row * tensor.dtype().size().unwrap_or(1);
            let mut out = Vec::with_capacity(rows.len() * row_bytes);
            for &r in rows {
                out.extend_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
            }
            TensorData::Fixed(out.into())
        }
        TensorData::Strings(strings) => TensorData::Strings(
            rows.iter().flat_map(|&r| strings[r * per_row..(r + 1) * per_row].iter().cloned()).collect(),
        ),
    };
    Ok(Tensor::from_parts_unchecked(tensor.dtype(), shape, data))
}

/// The spec named `name` among what a step reads.
fn read<'a>(stage: &str, reads: &'a [TensorSpec], name: &str) -> Result<&'a TensorSpec> {
    reads.iter().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = reads.iter().map(|s| s.name.as_str()).collect();
        Error::invalid_argument(format!("{stage} reads '{name}', but the step gives it only {names:?} (its `inputs`)"))
    })
}

/// The tensor named `name` a step was given.
fn given<'a>(stage: &str, inputs: &'a [NamedTensor], name: &str) -> Result<&'a Tensor> {
    inputs
        .iter()
        .find(|t| t.name == name)
        .map(|t| &t.tensor)
        .ok_or_else(|| Error::internal(format!("{stage}: input '{name}' is missing, this is a bug")))
}

/// Its f32 values, or an error naming the tensor and what it is.
fn floats(stage: &str, name: &str, tensor: &Tensor) -> Result<Vec<f32>> {
    tensor.to_vec::<f32>().ok_or_else(|| {
        Error::invalid_argument(format!(
            "{stage}: '{name}' is {} {}; it reads DT_FLOAT",
            tensor.dtype(),
            format_shape(tensor.shape())
        ))
    })
}

/// The same spec with a free first dimension, named `name`.
fn rows_of(spec: &TensorSpec, name: &str) -> TensorSpec {
    let mut shape = spec.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = -1;
    }
    TensorSpec::new(name, spec.dtype, shape)
}

/// One score per row: `[N]` or `[N, 1]`, f32.
fn one_score_per_row(stage: &str, spec: &TensorSpec) -> Result<()> {
    let fits = spec.dtype == DType::F32 && matches!(spec.shape.as_slice(), [_] | [_, 1] | [_, -1]);
    if !fits {
        return Err(Error::invalid_argument(format!(
            "{stage}: '{}' is {} {}; it reads one DT_FLOAT score per row ([N] or [N, 1])",
            spec.name,
            spec.dtype,
            format_shape(&spec.shape)
        )));
    }
    Ok(())
}

/// `top_rows`: the k best rows of everything the step reads.
#[derive(Debug)]
pub struct TopRows {
    k: usize,
    by: String,
    io: StageIo,
}

impl TopRows {
    /// Checked against what the step reads.
    pub fn new(config: &TopRowsConfig, reads: &[TensorSpec]) -> Result<TopRows> {
        if config.k == 0 {
            return Err(Error::invalid_argument("top_rows: k = 0; keep at least one row"));
        }
        if reads.iter().any(|s| s.name == "indices") {
            return Err(Error::invalid_argument(
                "top_rows: it makes 'indices' (which rows it kept); name the input it reads otherwise",
            ));
        }
        let by = read("top_rows", reads, &config.by)?;
        one_score_per_row("top_rows", by)?;
        if reads.iter().any(|s| s.shape.is_empty()) {
            return Err(Error::invalid_argument("top_rows: every tensor it reads must have rows (rank 1 or more)"));
        }
        let mut outputs: Vec<TensorSpec> = reads.iter().map(|s| rows_of(s, &s.name)).collect();
        outputs.push(TensorSpec::new("indices", DType::I64, vec![-1]));
        Ok(TopRows {
            k: config.k,
            by: config.by.clone(),
            io: StageIo { name: "top_rows".into(), inputs: reads.to_vec(), outputs },
        })
    }
}

impl Stage for TopRows {
    fn io(&self) -> &StageIo {
        &self.io
    }

    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let scores = floats("top_rows", &self.by, given("top_rows", &inputs, &self.by)?)?;
        let rows = given("top_rows", &inputs, &self.by)?.rows();
        if scores.len() != rows {
            return Err(Error::invalid_argument(format!(
                "top_rows: '{}' has {} values for {rows} rows",
                self.by,
                scores.len()
            )));
        }
        for input in &inputs {
            if input.tensor.rows() != rows {
                return Err(Error::invalid_argument(format!(
                    "top_rows: '{}' has {} rows, but '{}' scores {rows}",
                    input.name,
                    input.tensor.rows(),
                    self.by
                )));
            }
        }
        let best = super::classes::top_indexes(&scores, self.k.min(rows));
        let mut outputs = Vec::with_capacity(inputs.len() + 1);
        for input in &inputs {
            outputs.push(NamedTensor::new(input.name.clone(), take_rows(&input.tensor, &best, &input.name)?));
        }
        let indices: Vec<i64> = best.iter().map(|&i| i as i64).collect();
        outputs.push(NamedTensor::new("indices", Tensor::from_values(vec![indices.len() as i64], &indices)));
        Ok(outputs)
    }
}

/// `gather`: rows of `values` by `indices`.
#[derive(Debug)]
pub struct Gather {
    io: StageIo,
}

impl Gather {
    /// Checked against what the step reads: `values` with rows, integer
    /// `indices` of rank 1 (or `[k, 1]`).
    pub fn new(reads: &[TensorSpec]) -> Result<Gather> {
        let values = read("gather", reads, "values")?;
        let indices = read("gather", reads, "indices")?;
        if values.shape.is_empty() {
            return Err(Error::invalid_argument("gather: 'values' must have rows (rank 1 or more)"));
        }
        let integer = matches!(indices.dtype, DType::I64 | DType::I32);
        if !integer || !matches!(indices.shape.as_slice(), [_] | [_, 1]) {
            return Err(Error::invalid_argument(format!(
                "gather: 'indices' is {} {}; it reads DT_INT64 or DT_INT32 row indexes, [k] or [k, 1]",
                indices.dtype,
                format_shape(&indices.shape)
            )));
        }
        Ok(Gather {
            io: StageIo {
                name: "gather".into(),
                inputs: vec![values.clone(), indices.clone()],
                outputs: vec![rows_of(values, "values")],
            },
        })
    }
}

impl Stage for Gather {
    fn io(&self) -> &StageIo {
        &self.io
    }

    fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let values = given("gather", &inputs, "values")?;
        let indices = given("gather", &inputs, "indices")?;
        // Indexes may repeat rows: the output is sized by them, not by
        // `values`, so it is bounded before it is made.
        let mut shape = values.shape().to_vec();
        if let Some(first) = shape.first_mut() {
            *first = indices.len() as i64;
        }
        tensor_bytes(values.dtype(), &shape, cx.max_tensor_bytes, "gather's output 'values'")?;
        let wanted: Vec<i64> = match indices.dtype() {
            DType::I32 => indices.to_vec::<i32>().unwrap_or_default().into_iter().map(i64::from).collect(),
            _ => indices.to_vec::<i64>().unwrap_or_default(),
        };
        let rows: Vec<usize> = wanted
            .iter()
            .map(|&i| usize::try_from(i).map_err(|_| Error::invalid_argument(format!("gather: index {i} is negative"))))
            .collect::<Result<_>>()?;
        // Strings by their bytes: every copy of a row carries them into
        // the answer.
        if let Some(strings) = values.strings() {
            let total = values.shape().first().copied().unwrap_or(0).max(0) as usize;
            let per_row = strings.len().checked_div(total).unwrap_or(0);
            let mut bytes = 0usize;
            for &r in rows.iter().filter(|&&r| r < total) {
                let row: usize = strings[r * per_row..(r + 1) * per_row].iter().map(|s| s.len()).sum();
                bytes = bytes.saturating_add(row);
                if bytes > cx.max_tensor_bytes {
                    return Err(Error::resource_exhausted(format!(
                        "gather's output 'values' would hold more than {} bytes of strings (server.max_tensor_bytes)",
                        cx.max_tensor_bytes
                    )));
                }
            }
        }
        Ok(vec![NamedTensor::new("values", take_rows(values, &rows, "values")?)])
    }
}

/// `blend`: a weighted sum of same-shaped f32 scores.
#[derive(Debug)]
pub struct Blend {
    weights: Vec<(String, f32)>,
    io: StageIo,
}

impl Blend {
    /// Checked against what the step reads: a weight for each input, one
    /// f32 shape for all.
    pub fn new(config: &BlendConfig, reads: &[TensorSpec]) -> Result<Blend> {
        if config.weights.len() < 2 {
            return Err(Error::invalid_argument("blend: weights names fewer than two inputs; it blends two or more"));
        }
        let mut first: Option<&TensorSpec> = None;
        for (name, weight) in &config.weights {
            if !weight.is_finite() {
                return Err(Error::invalid_argument(format!(
                    "blend: weights.{name} = {weight}: expected a finite number"
                )));
            }
            let spec = read("blend", reads, name)?;
            if spec.dtype != DType::F32 {
                return Err(Error::invalid_argument(format!("blend: '{name}' is {}; it blends DT_FLOAT", spec.dtype)));
            }
            if let Some(first) = first {
                let agree = first.shape.len() == spec.shape.len()
                    && first.shape.iter().zip(&spec.shape).all(|(a, b)| *a < 0 || *b < 0 || a == b);
                if !agree {
                    return Err(Error::invalid_argument(format!(
                        "blend: '{}' is {} but '{name}' is {}; it blends tensors of one shape",
                        first.name,
                        format_shape(&first.shape),
                        format_shape(&spec.shape)
                    )));
                }
            }
            first.get_or_insert(spec);
        }
        if let Some(extra) = reads.iter().find(|s| !config.weights.contains_key(&s.name)) {
            return Err(Error::invalid_argument(format!(
                "blend: the step gives '{}', which has no weight",
                extra.name
            )));
        }
        let shape = first.map(|s| s.shape.clone()).unwrap_or_default();
        Ok(Blend {
            weights: config.weights.iter().map(|(n, w)| (n.clone(), *w)).collect(),
            io: StageIo {
                name: "blend".into(),
                inputs: reads.to_vec(),
                outputs: vec![TensorSpec::new("blended", DType::F32, shape)],
            },
        })
    }
}

impl Stage for Blend {
    fn io(&self) -> &StageIo {
        &self.io
    }

    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let mut sum: Option<(Vec<i64>, Vec<f32>)> = None;
        for (name, weight) in &self.weights {
            let tensor = given("blend", &inputs, name)?;
            let values = floats("blend", name, tensor)?;
            match &mut sum {
                None => sum = Some((tensor.shape().to_vec(), values.iter().map(|v| v * weight).collect())),
                Some((shape, acc)) => {
                    if shape.as_slice() != tensor.shape() {
                        return Err(Error::invalid_argument(format!(
                            "blend: '{name}' is {}, the others {}; it blends tensors of one shape",
                            format_shape(tensor.shape()),
                            format_shape(shape)
                        )));
                    }
                    acc.iter_mut().zip(&values).for_each(|(a, v)| *a += v * weight);
                }
            }
        }
        let (shape, values) = sum.ok_or_else(|| Error::internal("blend of nothing, this is a bug"))?;
        Ok(vec![NamedTensor::new("blended", Tensor::from_values(shape, &values))])
    }
}

/// `dot`: each item row's dot product with the query.
#[derive(Debug)]
pub struct Dot {
    io: StageIo,
}

impl Dot {
    /// Checked against what the step reads: f32 `query` `[1 or N, D]` and
    /// `items` `[N, D]`.
    pub fn new(reads: &[TensorSpec]) -> Result<Dot> {
        let query = read("dot", reads, "query")?;
        let items = read("dot", reads, "items")?;
        for spec in [query, items] {
            if spec.dtype != DType::F32 || spec.shape.len() != 2 {
                return Err(Error::invalid_argument(format!(
                    "dot: '{}' is {} {}; it reads DT_FLOAT rows of vectors [N, D]",
                    spec.name,
                    spec.dtype,
                    format_shape(&spec.shape)
                )));
            }
        }
        let (q, i) = (query.shape[1], items.shape[1]);
        if q >= 0 && i >= 0 && q != i {
            return Err(Error::invalid_argument(format!(
                "dot: 'query' has vectors of {q} and 'items' of {i}; they must be the same length"
            )));
        }
        Ok(Dot {
            io: StageIo {
                name: "dot".into(),
                inputs: vec![query.clone(), items.clone()],
                outputs: vec![TensorSpec::new("scores", DType::F32, vec![-1])],
            },
        })
    }
}

impl Stage for Dot {
    fn io(&self) -> &StageIo {
        &self.io
    }

    fn process(&self, inputs: Vec<NamedTensor>, _cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let query = given("dot", &inputs, "query")?;
        let items = given("dot", &inputs, "items")?;
        let (q, i) = (floats("dot", "query", query)?, floats("dot", "items", items)?);
        let dim = items.shape().get(1).copied().unwrap_or(0).max(0) as usize;
        let (query_rows, item_rows) = (query.rows(), items.rows());
        let shared = query_rows == 1;
        if query.shape().get(1).copied() != Some(dim as i64) || (!shared && query_rows != item_rows) {
            return Err(Error::invalid_argument(format!(
                "dot: 'query' is {} and 'items' {}; the query is one row, or one per item, of the items' length",
                format_shape(query.shape()),
                format_shape(items.shape())
            )));
        }
        let scores: Vec<f32> = (0..item_rows)
            .map(|r| {
                let row = &i[r * dim..(r + 1) * dim];
                let against = if shared { &q[..dim] } else { &q[r * dim..(r + 1) * dim] };
                row.iter().zip(against).map(|(a, b)| a * b).sum()
            })
            .collect();
        Ok(vec![NamedTensor::new("scores", Tensor::from_values(vec![item_rows as i64], &scores))])
    }
}

/// `concat`: inputs joined along their last dimension.
#[derive(Debug)]
pub struct Concat {
    order: Vec<String>,
    io: StageIo,
}

impl Concat {
    /// Checked against what the step reads: one fixed-width dtype, rank 2.
    pub fn new(config: &ConcatConfig, reads: &[TensorSpec]) -> Result<Concat> {
        if config.order.len() < 2 {
            return Err(Error::invalid_argument("concat: order names fewer than two inputs; it joins two or more"));
        }
        let specs: Vec<&TensorSpec> = config.order.iter().map(|n| read("concat", reads, n)).collect::<Result<_>>()?;
        let dtype = specs[0].dtype;
        let mut width = 0i64;
        for spec in &specs {
            if spec.dtype != dtype || dtype.size().is_none() || spec.shape.len() != 2 {
                return Err(Error::invalid_argument(format!(
                    "concat: '{}' is {} {}; it joins rows [N, D] of one fixed-width dtype ({dtype})",
                    spec.name,
                    spec.dtype,
                    format_shape(&spec.shape)
                )));
            }
            width = if width < 0 || spec.shape[1] < 0 { -1 } else { width + spec.shape[1] };
        }
        if let Some(extra) = reads.iter().find(|s| !config.order.contains(&s.name)) {
            return Err(Error::invalid_argument(format!(
                "concat: the step gives '{}', which order leaves out",
                extra.name
            )));
        }
        Ok(Concat {
            order: config.order.clone(),
            io: StageIo {
                name: "concat".into(),
                inputs: reads.to_vec(),
                outputs: vec![TensorSpec::new("joined", dtype, vec![-1, width])],
            },
        })
    }
}

impl Stage for Concat {
    fn io(&self) -> &StageIo {
        &self.io
    }

    fn process(&self, inputs: Vec<NamedTensor>, cx: &StageCx<'_>) -> Result<Vec<NamedTensor>> {
        let parts: Vec<&Tensor> = self.order.iter().map(|n| given("concat", &inputs, n)).collect::<Result<_>>()?;
        let elements: usize = parts.iter().map(|p| p.len()).sum();
        tensor_bytes(parts[0].dtype(), &[elements as i64], cx.max_tensor_bytes, "concat's output 'joined'")?;
        let rows = parts[0].rows();
        let dtype = parts[0].dtype();
        let size = dtype.size().unwrap_or(1);
        let mut widths = Vec::with_capacity(parts.len());
        for (name, part) in self.order.iter().zip(&parts) {
            if part.rows() != rows || part.dtype() != dtype || part.shape().len() != 2 {
                return Err(Error::invalid_argument(format!(
                    "concat: '{name}' is {} {}, the first {} {}; it joins rows [N, D] of one dtype",
                    part.dtype(),
                    format_shape(part.shape()),
                    dtype,
                    format_shape(parts[0].shape())
                )));
            }
            widths.push(part.shape()[1].max(0) as usize * size);
        }
        let total: usize = widths.iter().sum();
        let mut out = Vec::with_capacity(rows * total);
        for r in 0..rows {
            for (part, width) in parts.iter().zip(&widths) {
                let bytes: &Bytes = part.bytes().ok_or_else(|| Error::internal("concat of strings, this is a bug"))?;
                out.extend_from_slice(&bytes[r * width..(r + 1) * width]);
            }
        }
        let shape = vec![rows as i64, (total / size) as i64];
        Ok(vec![NamedTensor::new("joined", Tensor::from_bytes(dtype, shape, out.into())?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::stages::testing::ProcessNow;

    fn f32s(name: &str, shape: Vec<i64>, values: &[f32]) -> NamedTensor {
        NamedTensor::new(name, Tensor::from_values(shape, values))
    }

    #[test]
    fn top_rows_keeps_the_best_rows_of_everything_read() {
        let reads =
            [TensorSpec::new("score", DType::F32, vec![-1, 1]), TensorSpec::new("ids", DType::String, vec![-1])];
        let stage = TopRows::new(&TopRowsConfig { k: 2, by: "score".into() }, &reads).unwrap();
        let ids = Tensor::from_strings(vec![3], vec![Bytes::from("a"), Bytes::from("b"), Bytes::from("c")]).unwrap();
        let out =
            stage.process_now(vec![f32s("score", vec![3, 1], &[0.1, 0.9, 0.5]), NamedTensor::new("ids", ids)]).unwrap();
        assert_eq!(out[0].tensor.to_vec::<f32>().unwrap(), vec![0.9, 0.5]);
        assert_eq!(out[1].tensor.strings().unwrap(), &[Bytes::from("b"), Bytes::from("c")]);
        assert_eq!(out[2].tensor.to_vec::<i64>().unwrap(), vec![1, 2]);
        let short = stage.process_now(vec![
            f32s("score", vec![3, 1], &[0.1, 0.9, 0.5]),
            NamedTensor::new("ids", Tensor::from_strings(vec![1], vec![Bytes::from("a")]).unwrap()),
        ]);
        assert!(short.unwrap_err().to_string().contains("'ids' has 1 rows"));
    }

    #[test]
    fn gather_refuses_rows_out_of_range() {
        let reads =
            [TensorSpec::new("values", DType::F32, vec![-1, 2]), TensorSpec::new("indices", DType::I64, vec![-1])];
        let stage = Gather::new(&reads).unwrap();
        let values = f32s("values", vec![2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let out = stage
            .process_now(vec![values.clone(), NamedTensor::new("indices", Tensor::from_values(vec![2], &[1i64, 1]))])
            .unwrap();
        assert_eq!(out[0].tensor.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 3.0, 4.0]);
        let e = stage
            .process_now(vec![values.clone(), NamedTensor::new("indices", Tensor::from_values(vec![1], &[7i64]))])
            .unwrap_err();
        assert!(e.to_string().contains("row 7 of 'values'"), "{e}");
        // A million repeats of one row: refused before anything is made.
        let many = NamedTensor::new("indices", Tensor::from_values(vec![1 << 20], &vec![0i64; 1 << 20]));
        let cx = crate::pipeline::stage::StageCx::new(
            crate::pipeline::deadline::Deadline::NONE,
            &crate::pipeline::stage::never_gone,
            1 << 20,
        );
        let e = stage.process(vec![values, many], &cx).unwrap_err();
        assert!(e.to_string().contains("gather's output 'values'"), "{e}");
    }

    #[test]
    fn blend_weighs_and_checks_shapes() {
        let reads = [TensorSpec::new("a", DType::F32, vec![-1, 1]), TensorSpec::new("b", DType::F32, vec![-1, 1])];
        let weights = [("a".to_string(), 0.25), ("b".to_string(), 0.75)].into_iter().collect();
        let stage = Blend::new(&BlendConfig { weights }, &reads).unwrap();
        let out =
            stage.process_now(vec![f32s("a", vec![2, 1], &[1.0, 2.0]), f32s("b", vec![2, 1], &[3.0, 4.0])]).unwrap();
        assert_eq!(out[0].tensor.to_vec::<f32>().unwrap(), vec![2.5, 3.5]);
        let e = stage.process_now(vec![f32s("a", vec![2, 1], &[1.0, 2.0]), f32s("b", vec![1, 1], &[3.0])]).unwrap_err();
        assert!(e.to_string().contains("one shape"), "{e}");
        let lone = [("a".to_string(), 1.0)].into_iter().collect();
        assert!(Blend::new(&BlendConfig { weights: lone }, &reads).is_err());
    }

    #[test]
    fn dot_scores_items_against_one_query() {
        let reads =
            [TensorSpec::new("query", DType::F32, vec![1, 2]), TensorSpec::new("items", DType::F32, vec![-1, 2])];
        let stage = Dot::new(&reads).unwrap();
        let out = stage
            .process_now(vec![
                f32s("query", vec![1, 2], &[1.0, 2.0]),
                f32s("items", vec![2, 2], &[1.0, 1.0, 0.5, -1.0]),
            ])
            .unwrap();
        assert_eq!(out[0].tensor.to_vec::<f32>().unwrap(), vec![3.0, -1.5]);
        let e = stage
            .process_now(vec![f32s("query", vec![1, 3], &[1.0, 2.0, 3.0]), f32s("items", vec![1, 2], &[1.0, 1.0])])
            .unwrap_err();
        assert!(e.to_string().contains("one row, or one per item"), "{e}");
    }

    #[test]
    fn concat_joins_along_the_last_dimension() {
        let reads = [TensorSpec::new("a", DType::F32, vec![-1, 1]), TensorSpec::new("b", DType::F32, vec![-1, 2])];
        let stage = Concat::new(&ConcatConfig { order: vec!["b".into(), "a".into()] }, &reads).unwrap();
        assert_eq!(stage.outputs()[0].shape, vec![-1, 3]);
        let out = stage
            .process_now(vec![f32s("a", vec![2, 1], &[1.0, 2.0]), f32s("b", vec![2, 2], &[3.0, 4.0, 5.0, 6.0])])
            .unwrap();
        assert_eq!(out[0].tensor.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 1.0, 5.0, 6.0, 2.0]);
    }
}
