//! Table files — CSV or JSON lines — read into [`TableData`], the compact
//! in-memory layout of an embedded table: one contiguous buffer per feature
//! (rows × value bytes), a key → row index, nothing per cell.
//!
//! - CSV: a header row naming the key column and every feature; a cell
//!   holds a feature's values separated by whitespace. Extra columns are
//!   ignored.
//! - JSON lines (`.jsonl`, `.ndjson`): one object per line with the key (a
//!   string or an integer) and every feature (a value, or nested arrays as
//!   deep as its shape).
//!
//! Every row must hold every feature, every key must be unique and not
//! empty; an error names the file, the line, the key or feature and what
//! was expected, and nothing of a bad file is served.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use serde_json::Value;

use super::value;
use super::{Column, ColumnValues, Schema};
use crate::error::{Error, Result};
use crate::tensor::v2::encode_strings;
use crate::tensor::{Tensor, TensorData};

/// A table in memory.
pub struct TableData {
    keys: Vec<Bytes>,
    index: HashMap<Bytes, u32>,
    columns: Vec<StoredColumn>,
}

/// One feature's values for every row.
enum StoredColumn {
    /// `width` bytes per row.
    Fixed { width: usize, data: Vec<u8> },
    /// `per_row` strings per row.
    Strings { per_row: usize, data: Vec<Bytes> },
}

impl TableData {
    /// Rows.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when it has no rows.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The row of `key`.
    pub fn row(&self, key: &[u8]) -> Option<usize> {
        self.index.get(key).map(|&r| r as usize)
    }

    /// The key of row `r`.
    pub fn key(&self, r: usize) -> &Bytes {
        &self.keys[r]
    }

    /// Copies feature `f` of row `r` into key `i` of `column`.
    pub fn copy_into(&self, r: usize, f: usize, column: &mut Column, i: usize) {
        match (&self.columns[f], &mut column.values) {
            (StoredColumn::Fixed { width, data }, ColumnValues::Fixed(out)) => {
                out[i * width..(i + 1) * width].copy_from_slice(&data[r * width..(r + 1) * width]);
            }
            (StoredColumn::Strings { per_row, data }, ColumnValues::Strings(out)) => {
                out[i * per_row..(i + 1) * per_row].clone_from_slice(&data[r * per_row..(r + 1) * per_row]);
            }
            _ => return,
        }
        column.present[i] = true;
    }

    /// Feature `f` of row `r` in the Redis format (for `sluice features load`).
    pub fn stored(&self, r: usize, f: usize) -> Vec<u8> {
        match &self.columns[f] {
            StoredColumn::Fixed { width, data } => data[r * width..(r + 1) * width].to_vec(),
            StoredColumn::Strings { per_row, data } => encode_strings(&data[r * per_row..(r + 1) * per_row]),
        }
    }
}

/// Builds a table row by row.
struct Builder<'a> {
    schema: &'a Schema,
    source: String,
    data: TableData,
    lines: Vec<u64>,
}

impl<'a> Builder<'a> {
    fn new(schema: &'a Schema, path: &Path) -> Builder<'a> {
        let columns = schema
            .features
            .iter()
            .map(|(_, spec)| match spec.dtype.size() {
                Some(size) => StoredColumn::Fixed { width: size * spec.elements(), data: Vec::new() },
                None => StoredColumn::Strings { per_row: spec.elements(), data: Vec::new() },
            })
            .collect();
        Builder {
            schema,
            source: path.display().to_string(),
            data: TableData { keys: Vec::new(), index: HashMap::new(), columns },
            lines: Vec::new(),
        }
    }

    fn at(&self, line: u64) -> String {
        format!("{} line {line}", self.source)
    }

    /// Adds one row: its key and one value per feature, in schema order.
    fn push(&mut self, line: u64, key: Bytes, values: Vec<Tensor>) -> Result<()> {
        if key.is_empty() {
            return Err(Error::invalid_argument(format!("{}: the key is empty", self.at(line))));
        }
        let row = self.data.keys.len();
        let row32 = u32::try_from(row)
            .map_err(|_| Error::invalid_argument(format!("{}: more than 2^32 rows", self.at(line))))?;
        if let Some(&earlier) = self.data.index.get(&key) {
            return Err(Error::invalid_argument(format!(
                "{}: key \"{}\" appears again (first on line {}); keys are unique",
                self.at(line),
                String::from_utf8_lossy(&key),
                self.lines[earlier as usize]
            )));
        }
        for (column, value) in self.data.columns.iter_mut().zip(values) {
            match (column, value.data()) {
                (StoredColumn::Fixed { data, .. }, TensorData::Fixed(bytes)) => data.extend_from_slice(bytes),
                (StoredColumn::Strings { data, .. }, TensorData::Strings(strings)) => {
                    data.extend(strings.iter().cloned())
                }
                _ => return Err(Error::internal("a feature value of the wrong kind, this is a bug")),
            }
        }
        self.data.index.insert(key.clone(), row32);
        self.data.keys.push(key);
        self.lines.push(line);
        Ok(())
    }
}

/// Reads the table file at `path` (`.csv`, `.jsonl` or `.ndjson`) whose
/// rows have their key in `key_column` and the features of `schema`.
pub fn read(path: &Path, schema: &Schema, key_column: &str) -> Result<TableData> {
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let text = std::fs::read(path)
        .map_err(|e| Error::unavailable(format!("cannot read feature table file {}: {e}", path.display())))?;
    let mut builder = Builder::new(schema, path);
    match extension.as_str() {
        "csv" => read_csv(&text, key_column, &mut builder)?,
        "jsonl" | "ndjson" | "json" => read_json_lines(&text, key_column, &mut builder)?,
        other => {
            return Err(Error::invalid_argument(format!(
                "feature table file {}: unknown extension \"{other}\"; expected .csv, .jsonl or .ndjson",
                path.display()
            )))
        }
    }
    Ok(builder.data)
}

fn read_csv(text: &[u8], key_column: &str, builder: &mut Builder<'_>) -> Result<()> {
    let mut reader = csv::ReaderBuilder::new().has_headers(true).trim(csv::Trim::All).from_reader(text);
    let headers = reader
        .headers()
        .map_err(|e| Error::invalid_argument(format!("{}: cannot read the header row: {e}", builder.source)))?
        .clone();
    let column_of = |name: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            Error::invalid_argument(format!(
                "{}: no column '{name}' in the header row {:?}",
                builder.source,
                headers.iter().collect::<Vec<_>>()
            ))
        })
    };
    let key_at = column_of(key_column)?;
    let feature_at: Vec<usize> =
        builder.schema.features.iter().map(|(name, _)| column_of(name)).collect::<Result<_>>()?;
    for record in reader.records() {
        let record = record.map_err(|e| Error::invalid_argument(format!("{}: {e}", builder.source)))?;
        let line = record.position().map_or(0, |p| p.line());
        let cell = |at: usize| record.get(at).unwrap_or("");
        let mut values = Vec::with_capacity(feature_at.len());
        for ((name, spec), &at) in builder.schema.features.iter().zip(&feature_at) {
            values.push(value::from_text(spec, cell(at), &format!("{} feature '{name}'", builder.at(line)))?);
        }
        builder.push(line, Bytes::copy_from_slice(cell(key_at).as_bytes()), values)?;
    }
    Ok(())
}

fn read_json_lines(text: &[u8], key_column: &str, builder: &mut Builder<'_>) -> Result<()> {
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = n as u64 + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let object: serde_json::Map<String, Value> = serde_json::from_slice(line)
            .map_err(|e| Error::invalid_argument(format!("{}: not a JSON object: {e}", builder.at(line_no))))?;
        let key = match object.get(key_column) {
            Some(Value::String(key)) => Bytes::copy_from_slice(key.as_bytes()),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Bytes::from(n.to_string()),
            Some(other) => {
                return Err(Error::invalid_argument(format!(
                    "{}: key '{key_column}' is {other}; expected a string or an integer",
                    builder.at(line_no)
                )))
            }
            None => return Err(Error::invalid_argument(format!("{}: no key '{key_column}'", builder.at(line_no)))),
        };
        let mut values = Vec::with_capacity(builder.schema.features.len());
        for (name, spec) in &builder.schema.features {
            let what = format!("{} feature '{name}'", builder.at(line_no));
            let value = object
                .get(name)
                .ok_or_else(|| Error::invalid_argument(format!("{what}: missing; every row holds every feature")))?;
            values.push(value::from_json(spec, value, &what)?);
        }
        builder.push(line_no, key, values)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::features::FeatureSpec;
    use crate::tensor::DType;

    fn schema() -> Schema {
        Schema {
            table: "items".into(),
            features: vec![
                ("stats".into(), FeatureSpec { dtype: DType::F32, shape: vec![2] }),
                ("tags".into(), FeatureSpec { dtype: DType::String, shape: vec![2] }),
            ],
        }
    }

    fn write(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn csv_and_json_lines_read_the_same_table() {
        let (_a, csv) = write("t.csv", "id,tags,stats,extra\ni1,a b,1 2,x\ni2,c d,3.5 -1,y\n");
        let (_b, jsonl) = write(
            "t.jsonl",
            "{\"id\":\"i1\",\"stats\":[1,2],\"tags\":[\"a\",\"b\"]}\n\n{\"id\":\"i2\",\"stats\":[3.5,-1],\"tags\":[\"c\",\"d\"]}\n",
        );
        for path in [csv, jsonl] {
            let table = read(&path, &schema(), "id").unwrap();
            assert_eq!(table.len(), 2);
            let r = table.row(b"i2").unwrap();
            let mut stats = Column::empty(&schema().features[0].1, 1);
            table.copy_into(r, 0, &mut stats, 0);
            assert_eq!(stats.values, ColumnValues::Fixed(bytemuck::cast_slice(&[3.5f32, -1.0]).to_vec()));
            let mut tags = Column::empty(&schema().features[1].1, 2);
            table.copy_into(r, 1, &mut tags, 1);
            assert_eq!(tags.present, vec![false, true]);
            assert_eq!(tags.values, ColumnValues::Strings(vec![Bytes::new(), Bytes::new(), "c".into(), "d".into()]));
            assert!(table.row(b"i3").is_none());
        }
    }

    #[test]
    fn bad_files_are_refused_with_the_line_and_what_was_wrong() {
        for (name, text, expected) in [
            ("t.csv", "id,stats\ni1,1 2\n", "no column 'tags'"),
            ("t.csv", "id,stats,tags\ni1,1 2,a b\ni1,1 2,a b\n", "appears again (first on line 2)"),
            ("t.csv", "id,stats,tags\ni1,1,a b\n", "line 2 feature 'stats': 1 values"),
            ("t.csv", "id,stats,tags\n,1 2,a b\n", "the key is empty"),
            ("t.jsonl", "{\"id\":\"i1\",\"stats\":[1,2]}\n", "feature 'tags': missing"),
            (
                "t.jsonl",
                "{\"id\":\"i1\",\"stats\":[1,2],\"tags\":[\"a\",\"b\"]}\n{\"id\":\n",
                "line 2: not a JSON object",
            ),
            ("t.jsonl", "{\"id\":[1],\"stats\":[1,2],\"tags\":[\"a\",\"b\"]}\n", "expected a string or an integer"),
            ("t.txt", "", "unknown extension"),
        ] {
            let (_dir, path) = write(name, text);
            let err = read(&path, &schema(), "id").err().unwrap_or_else(|| panic!("{text} was accepted"));
            assert!(err.message().contains(expected), "{text}: {err}");
        }
    }
}
