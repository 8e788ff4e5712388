//! A Rank request's candidates, checked and read in one pass over the request's protobuf encoding.
//!
//! Why native: read through protobuf's Python objects, 200 candidates make about a thousand Python
//! objects (an id, a prediction block and an item type each, twice over), and in a loaded server that was
//! a quarter of a Rank's CPU (bench/serving_ab.py against a server that stops after the checks). Here the
//! only objects made are the results; an item id's string only when the server asks for it (the page it
//! answers with), and the authors' only for a Rank with a user-author term.
//!
//! The reader takes the request as the protobuf encoders write it (serving/wire.py says which shapes) and
//! answers `None` for anything else: a candidate with a field missing, repeated, unknown or differently
//! encoded, an id that is empty, not UTF-8 or too long, a repeated item id, an item type other than the
//! one asked for, a prediction outside its range. The server then decodes the request in full and walks
//! it candidate by candidate, which names the first bad field or accepts the unusual encoding; so this
//! reader never has to explain a refusal, only be sure of what it accepts. It is safe Rust: a malformed
//! length or varint ends the read with `None`, never a read outside the request.

use std::collections::{HashMap, HashSet};

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// RankRequest.candidates (recsys/v1/serving.proto).
const CANDIDATES_FIELD: u64 = 5;
/// The tag of DecisionRecord.candidates (field 10, length-delimited): the record copies the candidates.
const RECORD_CANDIDATES_TAG: u8 = (10 << 3) | 2;
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;
const FIXED32: u64 = 5;

/// A cursor over an encoded message; every read checks its bounds and answers `None` past them.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let byte = *self.buf.get(self.pos)?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn advance(&mut self, count: usize) -> Option<()> {
        let end = self.pos.checked_add(count)?;
        if end > self.buf.len() {
            return None;
        }
        self.pos = end;
        Some(())
    }

    /// The span (start, end) of a length-delimited field's payload.
    fn payload(&mut self) -> Option<(usize, usize)> {
        let length = usize::try_from(self.varint()?).ok()?;
        let start = self.pos;
        self.advance(length)?;
        Some((start, self.pos))
    }

    /// (field number, wire type) of the next field.
    fn tag(&mut self) -> Option<(u64, u64)> {
        let tag = self.varint()?;
        let field = tag >> 3;
        if field == 0 {
            return None;
        }
        Some((field, tag & 7))
    }

    fn skip(&mut self, wire_type: u64) -> Option<()> {
        match wire_type {
            VARINT => self.varint().map(|_| ()),
            FIXED64 => self.advance(8),
            LENGTH_DELIMITED => self.payload().map(|_| ()),
            FIXED32 => self.advance(4),
            _ => None, // groups: long deprecated, and no field of RankRequest is one
        }
    }
}

/// What a Rank needs of its candidates and how each must look to be accepted here.
struct Rules {
    width: usize,
    item_type: u64,
    max_id_chars: usize,
    max_prediction: f64,
}

impl Rules {
    fn id_ok(&self, bytes: &[u8], required: bool) -> bool {
        match std::str::from_utf8(bytes) {
            // a character is at least a byte: only a long id's characters are counted
            Ok(text) => {
                (!required || !text.is_empty())
                    && (text.len() <= self.max_id_chars
                        || text.chars().count() <= self.max_id_chars)
            }
            Err(_) => false,
        }
    }

    /// The spans of the item id and of the author id (empty when there is none), after adding the
    /// candidate's predictions to `predictions`.
    fn candidate(
        &self,
        request: &[u8],
        span: (usize, usize),
        predictions: &mut Vec<f64>,
    ) -> Option<((usize, usize), (usize, usize))> {
        let mut reader = Reader {
            buf: &request[..span.1],
            pos: span.0,
        };
        let (mut item_id, mut author_id, mut item_type, mut block) = (None, None, None, None);
        while !reader.at_end() {
            match reader.tag()? {
                (1, LENGTH_DELIMITED) if item_id.is_none() => item_id = Some(reader.payload()?),
                (2, LENGTH_DELIMITED) if author_id.is_none() => author_id = Some(reader.payload()?),
                (3, VARINT) if item_type.is_none() => item_type = Some(reader.varint()?),
                (4, LENGTH_DELIMITED) if block.is_none() => block = Some(reader.payload()?),
                _ => return None,
            }
        }
        let (item_id, item_type, block) = (item_id?, item_type?, block?);
        if item_type != self.item_type || block.1 - block.0 != 4 * self.width {
            return None;
        }
        if !self.id_ok(&request[item_id.0..item_id.1], true) {
            return None;
        }
        if let Some((start, end)) = author_id {
            if !self.id_ok(&request[start..end], false) {
                return None;
            }
        }
        for bytes in request[block.0..block.1].chunks_exact(4) {
            let value = f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
            if !(0.0..=self.max_prediction).contains(&value) {
                return None; // NaN included
            }
            predictions.push(value);
        }
        Some((item_id, author_id.unwrap_or((0, 0))))
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: usize) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The item ids of the candidates, in order, read from the request's bytes when asked for.
#[pyclass(frozen, sequence, module = "recsys_rl_rankwire")]
struct ItemIds {
    request: Py<PyBytes>,
    spans: Vec<(usize, usize)>,
}

#[pymethods]
impl ItemIds {
    fn __len__(&self) -> usize {
        self.spans.len()
    }

    fn __getitem__<'py>(&self, py: Python<'py>, index: isize) -> PyResult<Bound<'py, PyString>> {
        let count = self.spans.len() as isize;
        let position = if index < 0 { index + count } else { index };
        if !(0..count).contains(&position) {
            return Err(PyIndexError::new_err(format!("item id {index} of {count}")));
        }
        let (start, end) = self.spans[position as usize];
        let bytes = &self.request.bind(py).as_bytes()[start..end];
        let text =
            std::str::from_utf8(bytes).map_err(|err| PyIndexError::new_err(err.to_string()))?;
        Ok(PyString::new(py, text))
    }
}

/// The candidates' author ids, grouped when a Rank's user-author term asks for them.
#[pyclass(frozen, module = "recsys_rl_rankwire")]
struct Authors {
    request: Py<PyBytes>,
    spans: Vec<(usize, usize)>, // empty: no author
}

#[pymethods]
impl Authors {
    /// `(authors, rows)`: each distinct author id in order of first appearance, and for each candidate
    /// the index of its author in that list as little-endian int64, -1 for a candidate without one.
    fn rows<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Vec<Bound<'py, PyString>>, Bound<'py, PyBytes>)> {
        let request = self.request.bind(py).as_bytes();
        let mut index: HashMap<&[u8], i64> = HashMap::new();
        let mut authors = Vec::new();
        let mut rows = Vec::with_capacity(8 * self.spans.len());
        for &(start, end) in &self.spans {
            let row = if start == end {
                -1
            } else {
                let author = &request[start..end];
                match index.get(author) {
                    Some(&row) => row,
                    None => {
                        let row = authors.len() as i64;
                        let text = std::str::from_utf8(author)
                            .map_err(|err| PyValueError::new_err(err.to_string()))?;
                        authors.push(PyString::new(py, text));
                        index.insert(author, row);
                        row
                    }
                }
            };
            rows.extend_from_slice(&row.to_le_bytes());
        }
        Ok((authors, PyBytes::new(py, &rows)))
    }
}

/// `(predictions, record_candidates, item_ids, authors)` of an encoded RankRequest, or None (see the module doc).
///
/// predictions: the candidates' predictions as little-endian float64, candidate after candidate, `width`
/// each (float32 as sent, widened exactly); record_candidates: DecisionRecord's candidates field holding
/// each candidate's encoding as it came; item_ids: a sequence of the candidates' item ids; authors: their
/// author ids, grouped on demand.
#[pyfunction]
#[pyo3(signature = (request, *, width, item_type, max_id_chars, max_prediction))]
fn rank_candidates<'py>(
    py: Python<'py>,
    request: Bound<'py, PyBytes>,
    width: usize,
    item_type: u64,
    max_id_chars: usize,
    max_prediction: f64,
) -> Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, ItemIds, Authors)> {
    let rules = Rules {
        width,
        item_type,
        max_id_chars,
        max_prediction,
    };
    let bytes = request.as_bytes();
    let mut reader = Reader { buf: bytes, pos: 0 };
    let mut spans = Vec::new();
    let mut author_spans = Vec::new();
    let mut predictions = Vec::new();
    let mut record = Vec::with_capacity(bytes.len() + bytes.len() / 16);
    while !reader.at_end() {
        let (field, wire_type) = reader.tag()?;
        if field != CANDIDATES_FIELD {
            reader.skip(wire_type)?;
            continue;
        }
        if wire_type != LENGTH_DELIMITED {
            return None;
        }
        let candidate = reader.payload()?;
        let (item_id, author_id) = rules.candidate(bytes, candidate, &mut predictions)?;
        spans.push(item_id);
        author_spans.push(author_id);
        record.push(RECORD_CANDIDATES_TAG);
        put_varint(&mut record, candidate.1 - candidate.0);
        record.extend_from_slice(&bytes[candidate.0..candidate.1]);
    }
    let mut seen = HashSet::with_capacity(spans.len());
    if !spans
        .iter()
        .all(|&(start, end)| seen.insert(&bytes[start..end]))
    {
        return None; // a repeated item id
    }
    let widened: Vec<u8> = predictions
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect();
    Some((
        PyBytes::new(py, &widened),
        PyBytes::new(py, &record),
        ItemIds {
            request: request.clone().unbind(),
            spans,
        },
        Authors {
            request: request.unbind(),
            spans: author_spans,
        },
    ))
}

#[pymodule]
fn recsys_rl_rankwire(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(rank_candidates, module)?)?;
    module.add_class::<ItemIds>()?;
    module.add_class::<Authors>()?;
    Ok(())
}
