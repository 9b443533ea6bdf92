//! The GGUF header, read defensively.
//!
//! A model file is untrusted input: a download cut short, a file from a newer converter, or one
//! crafted to crash whatever opens it. This reader walks the header (format spec:
//! <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>) into a [`Header`]: candle's
//! metadata values, and each tensor's [`TensorType`] (candle's formats, and MXFP4, which only
//! our kernels read), shape and offset. Every count, size and offset from the file is checked
//! before it is used, with checked arithmetic. A bad header is a
//! [`HeaderError`], never a panic or a wrapped number: candle's reader divides by
//! `general.alignment` unchecked and multiplies tensor dimensions unchecked, so Rill does not
//! hand it a header it has not checked (issue 13). The rules follow llama.cpp's `gguf.cpp`:
//! an alignment that is a power of two, at most four dimensions whose product fits an `i64`,
//! a first dimension that fills whole blocks, no tensor named twice, tensor data aligned and
//! inside the file.
//!
//! A tensor type Rill does not run (the IQ formats, …) is named as such
//! ([`HeaderError::UnsupportedType`]): the file is not damaged.
//!
//! Metadata costs what it weighs (issue 40): a value held here takes about 32 bytes whatever
//! the file spent on it (one for a `u8`), so a 16.8 MB file of byte arrays once took 532 MB to
//! list. One array holds at most [`MAX_ARRAY`] items and all the metadata [`MAX_VALUES`]
//! values and [`MAX_HELD`] bytes, limits real files stay well under (the largest vocabularies
//! have about 260,000 tokens). And [`read_summary`], which listing uses, checks every array but
//! holds none: a listing needs names and numbers, not vocabularies.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::gguf_file::{Value, VersionedMagic};
use candle_core::quantized::GgmlDType;

use crate::kernels::TensorType;

/// Where a tensor is and how it is stored.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub dtype: TensorType,
    /// Row-major (candle's order: GGUF lists the fastest-moving dimension first).
    pub shape: candle_core::Shape,
    /// From the start of the tensor data.
    pub offset: u64,
}

/// A checked GGUF header: its metadata and its tensors.
#[derive(Debug)]
pub struct Header {
    pub magic: VersionedMagic,
    pub metadata: HashMap<String, Value>,
    pub tensor_infos: HashMap<String, TensorInfo>,
    /// Where the tensor data starts in the file.
    pub tensor_data_offset: u64,
}

/// Longest string a header may hold (llama.cpp's limit).
const MAX_STRING: u64 = 1 << 30;
/// Most items in one metadata array: four times the largest real vocabulary.
pub const MAX_ARRAY: u64 = 1 << 20;
/// Most values (scalars and array items) in all the metadata held.
pub const MAX_VALUES: u64 = 1 << 22;
/// Most bytes the held metadata may take in memory (strings' bytes and every value's slot).
pub const MAX_HELD: u64 = 512 << 20;
/// What one held value takes besides a string's bytes (candle's `Value`).
const VALUE_BYTES: u64 = std::mem::size_of::<Value>() as u64;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays in arrays.
const MAX_DEPTH: usize = 8;
/// The data alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// The header is damaged, truncated or inconsistent; the text says where.
    Damaged(String),
    /// A tensor is stored in a type this engine does not read.
    UnsupportedType { tensor: String, type_name: String },
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Damaged(m) => f.write_str(m),
            HeaderError::UnsupportedType { tensor, type_name } => write!(
                f,
                "tensor `{tensor}` is stored as {type_name}, a format Rill does not run yet \
                 (the file itself looks fine)"
            ),
        }
    }
}

fn damaged(m: impl Into<String>) -> HeaderError {
    HeaderError::Damaged(m.into())
}

/// ggml's name of a tensor type id (`ggml.h`), for types candle does not read.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        40 => "NVFP4",
        41 => "Q1_0",
        _ => return None,
    })
}

fn dtype_of(id: u32) -> Option<TensorType> {
    if id == 39 {
        return Some(TensorType::Mxfp4);
    }
    Some(TensorType::Ggml(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    }))
}

/// Bytes a tensor of `dims` in `dtype` takes, or why it cannot be stored.
pub fn tensor_bytes(dims: &[usize], dtype: TensorType) -> Result<u64, String> {
    let block = dtype.block_size();
    let mut elems: u64 = 1;
    for &d in dims {
        elems = elems
            .checked_mul(d as u64)
            .filter(|&e| e <= i64::MAX as u64 && usize::try_from(e).is_ok())
            .ok_or("its dimensions multiply past 2^63")?;
    }
    if dims.first().is_some_and(|&d| d % block != 0) {
        return Err(format!(
            "its rows of {} are not whole blocks of {block}",
            dims[0]
        ));
    }
    (elems / block as u64)
        .checked_mul(dtype.type_size() as u64)
        .ok_or_else(|| "its size overflows".into())
}

struct Reader<'a, R> {
    r: &'a mut R,
    /// Bytes left in the file after the reading position.
    left: u64,
    wide: bool,
    /// Whether arrays are kept (else checked and passed over).
    hold_arrays: bool,
    /// Values held so far, and the bytes they take.
    values: u64,
    held: u64,
}

impl<R: Read + Seek> Reader<'_, R> {
    /// Counts a value about to be held, refusing metadata past [`MAX_VALUES`] or [`MAX_HELD`].
    fn hold(&mut self, extra_bytes: u64, key: &str) -> Result<(), HeaderError> {
        self.values += 1;
        self.held = self.held.saturating_add(VALUE_BYTES + extra_bytes);
        if self.values > MAX_VALUES || self.held > MAX_HELD {
            return Err(damaged(format!(
                "`{key}`: the metadata holds more than {MAX_VALUES} values or {} MB, past \
                 what any real model carries",
                MAX_HELD >> 20
            )));
        }
        Ok(())
    }

    /// Passes over `n` bytes of the file: a few (a token's text) read through the reader's
    /// buffer, more sought past (a seek empties a buffered reader's buffer).
    fn skip(&mut self, n: u64, what: &str) -> Result<(), HeaderError> {
        if n > self.left {
            return Err(damaged(format!("truncated in {what}")));
        }
        let truncated = |_| damaged(format!("truncated in {what}"));
        let mut small = [0u8; 256];
        match usize::try_from(n) {
            Ok(k) if k <= small.len() => self.r.read_exact(&mut small[..k]).map_err(truncated)?,
            _ => {
                self.r
                    .seek(SeekFrom::Current(n as i64))
                    .map_err(truncated)?;
            }
        }
        self.left -= n;
        Ok(())
    }
    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], HeaderError> {
        let mut b = [0u8; N];
        if self.left < N as u64 || self.r.read_exact(&mut b).is_err() {
            return Err(damaged(format!("truncated in {what}")));
        }
        self.left -= N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32, HeaderError> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, HeaderError> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    /// A length or count: 32 bits in version 1, 64 after.
    fn len(&mut self, what: &str) -> Result<u64, HeaderError> {
        match self.wide {
            true => self.u64(what),
            false => self.u32(what).map(u64::from),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, HeaderError> {
        let n = self.len(what)?;
        if n > MAX_STRING || n > self.left {
            return Err(damaged(format!(
                "{what}: a string of {n} bytes, with {} left in the file",
                self.left
            )));
        }
        let mut v = vec![0u8; n as usize];
        self.r
            .read_exact(&mut v)
            .map_err(|_| damaged(format!("truncated in {what}")))?;
        self.left -= n;
        // As candle does: strings are meant to be UTF-8 without a NUL, and some are not.
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// One value, counted as held; `None` for an array passed over (`hold_arrays` off).
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Option<Value>, HeaderError> {
        if ty == 9 {
            return self.array(key, depth);
        }
        let held = depth == 0 || self.hold_arrays;
        if !held {
            // An item of an array passed over: checked, not kept.
            match ty {
                8 => {
                    let n = self.len(key)?;
                    if n > MAX_STRING {
                        return Err(damaged(format!("`{key}`: a string of {n} bytes")));
                    }
                    self.skip(n, key)?;
                }
                _ => {
                    self.scalar(ty, key)?;
                }
            }
            return Ok(None);
        }
        let v = self.scalar(ty, key)?;
        let extra = match &v {
            Value::String(s) => s.len() as u64,
            _ => 0,
        };
        self.hold(extra, key)?;
        Ok(Some(v))
    }

    /// An array: its items checked, and held when `hold_arrays` is on.
    fn array(&mut self, key: &str, depth: usize) -> Result<Option<Value>, HeaderError> {
        if depth >= MAX_DEPTH {
            return Err(damaged(format!("`{key}`: arrays nested too deep")));
        }
        let item = self.u32(key)?;
        let n = self.len(key)?;
        // Every item takes at least one byte: a count past the file is a lie.
        if n > self.left {
            return Err(damaged(format!(
                "`{key}`: an array of {n} items, with {} bytes left in the file",
                self.left
            )));
        }
        if n > MAX_ARRAY {
            return Err(damaged(format!(
                "`{key}`: an array of {n} items, more than the {MAX_ARRAY} Rill reads (the \
                 largest real vocabularies have about 260,000)"
            )));
        }
        if !self.hold_arrays {
            // Fixed-size items are passed over at once; others one by one.
            if let Some(size) = fixed_size(item) {
                self.skip(n * size, key)?;
            } else {
                for _ in 0..n {
                    self.value(item, key, depth + 1)?;
                }
            }
            return Ok(None);
        }
        self.hold(0, key)?;
        let mut items = Vec::with_capacity(n.min(1 << 16) as usize);
        for _ in 0..n {
            items.extend(self.value(item, key, depth + 1)?);
        }
        Ok(Some(Value::Array(items)))
    }

    fn scalar(&mut self, ty: u32, key: &str) -> Result<Value, HeaderError> {
        Ok(match ty {
            0 => Value::U8(self.bytes::<1>(key)?[0]),
            1 => Value::I8(self.bytes::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(self.u32(key)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(key)?)),
            7 => match self.bytes::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(damaged(format!("`{key}`: {b} is not a boolean"))),
            },
            8 => Value::String(self.string(key)?),
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(self.u64(key)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(key)?)),
            t => return Err(damaged(format!("`{key}`: unknown value type {t}"))),
        })
    }
}

/// Bytes an item of type `ty` takes, when fixed (every type but strings and arrays).
fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Reads and checks the header of a GGUF file of `file_len` bytes from the start of `r`.
pub fn read<R: Read + Seek>(r: &mut R, file_len: u64) -> Result<Header, HeaderError> {
    read_with(r, file_len, true)
}

/// [`read`], with every metadata array checked but none held (each is held empty): what a
/// listing needs, at the cost of the scalars alone.
pub fn read_summary<R: Read + Seek>(r: &mut R, file_len: u64) -> Result<Header, HeaderError> {
    read_with(r, file_len, false)
}

fn read_with<R: Read + Seek>(
    r: &mut R,
    file_len: u64,
    hold_arrays: bool,
) -> Result<Header, HeaderError> {
    r.seek(SeekFrom::Start(0))
        .map_err(|e| damaged(e.to_string()))?;
    let mut rd = Reader {
        r,
        left: file_len,
        wide: true,
        hold_arrays,
        values: 0,
        held: 0,
    };
    if &rd.bytes::<4>("the magic")? != b"GGUF" {
        return Err(damaged("not a GGUF file"));
    }
    let magic = match rd.u32("the version")? {
        1 => VersionedMagic::GgufV1,
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => {
            return Err(damaged(format!(
                "GGUF version {v}, which Rill does not read"
            )))
        }
    };
    rd.wide = magic != VersionedMagic::GgufV1;
    let n_tensors = rd.len("the tensor count")?;
    let n_kv = rd.len("the metadata count")?;
    // A metadata entry takes at least 13 bytes and a tensor entry 24.
    let least = n_kv
        .saturating_mul(13)
        .saturating_add(n_tensors.saturating_mul(24));
    if least > rd.left {
        return Err(damaged(format!(
            "{n_tensors} tensors and {n_kv} metadata entries cannot fit in the file"
        )));
    }

    let mut metadata = HashMap::new();
    for i in 0..n_kv {
        let key = rd.string(&format!("metadata key {i}"))?;
        let ty = rd.u32(&key)?;
        // An array passed over is held empty, so a key named twice is caught all the same.
        let value = rd.value(ty, &key, 0)?.unwrap_or(Value::Array(Vec::new()));
        if metadata.insert(key.clone(), value).is_some() {
            return Err(damaged(format!("metadata `{key}` appears twice")));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match (v, v.to_u64()) {
            (Value::Bool(_), _) => return Err(damaged("`general.alignment` is a boolean")),
            (_, Ok(a)) if a.is_power_of_two() => a,
            _ => {
                return Err(damaged(format!(
                    "`general.alignment` is {v:?}; it must be a power of two"
                )))
            }
        },
    };

    let mut tensor_infos = HashMap::new();
    let mut sizes = Vec::new();
    for i in 0..n_tensors {
        let name = rd.string(&format!("tensor name {i}"))?;
        let n_dims = rd.u32(&name)?;
        if n_dims > MAX_DIMS {
            return Err(damaged(format!(
                "tensor `{name}` has {n_dims} dimensions (at most {MAX_DIMS})"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = rd.len(&name)?;
            dims.push(usize::try_from(d).map_err(|_| damaged(format!("tensor `{name}`: {d}")))?);
        }
        let ty = rd.u32(&name)?;
        let offset = rd.u64(&name)?;
        let dtype = dtype_of(ty).ok_or_else(|| match ggml_type_name(ty) {
            Some(t) => HeaderError::UnsupportedType {
                tensor: name.clone(),
                type_name: t.into(),
            },
            None => damaged(format!("tensor `{name}` has unknown type {ty}")),
        })?;
        let bytes =
            tensor_bytes(&dims, dtype).map_err(|m| damaged(format!("tensor `{name}`: {m}")))?;
        if offset % alignment != 0 {
            return Err(damaged(format!(
                "tensor `{name}` starts at {offset}, not a multiple of the alignment {alignment}"
            )));
        }
        sizes.push((name.clone(), offset, bytes));
        // GGUF lists the fastest-moving dimension first; candle's shapes are row-major.
        dims.reverse();
        let info = TensorInfo {
            dtype,
            shape: candle_core::Shape::from(dims),
            offset,
        };
        if tensor_infos.insert(name.clone(), info).is_some() {
            return Err(damaged(format!("tensor `{name}` appears twice")));
        }
    }

    let position = file_len - rd.left;
    let tensor_data_offset = position
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| damaged("the tensor data would start past 2^64"))?;
    // A truncated download is caught here, not when a tensor is read.
    for (name, offset, bytes) in sizes {
        let end = tensor_data_offset
            .checked_add(offset)
            .and_then(|s| s.checked_add(bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(damaged(format!(
                    "truncated: tensor `{name}` needs {bytes} bytes at {offset} past the header, \
                     beyond the file's {file_len} bytes (incomplete download?)"
                )))
            }
        }
    }
    Ok(Header {
        magic,
        metadata,
        tensor_infos,
        tensor_data_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A header of `u8` arrays only, `items` each, and no tensors.
    fn byte_arrays(arrays: &[(&str, u64)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((arrays.len() as u64 + 1).to_le_bytes());
        let key = |out: &mut Vec<u8>, k: &str| {
            out.extend((k.len() as u64).to_le_bytes());
            out.extend(k.as_bytes());
        };
        key(&mut out, "general.architecture");
        out.extend(8u32.to_le_bytes());
        out.extend(5u64.to_le_bytes());
        out.extend(b"llama");
        for (k, n) in arrays {
            key(&mut out, k);
            out.extend(9u32.to_le_bytes());
            out.extend(0u32.to_le_bytes());
            out.extend(n.to_le_bytes());
            out.extend(std::iter::repeat_n(7u8, *n as usize));
        }
        out
    }

    fn read_bytes(bytes: &[u8], summary: bool) -> Result<Header, HeaderError> {
        let len = bytes.len() as u64;
        match summary {
            true => read_summary(&mut Cursor::new(bytes), len),
            false => read(&mut Cursor::new(bytes), len),
        }
    }

    #[test]
    fn an_array_past_the_limit_is_refused_by_name_issue_40() {
        let bytes = byte_arrays(&[("tokenizer.ggml.token_type", MAX_ARRAY + 1)]);
        let err = read_bytes(&bytes, false).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.ggml.token_type") && err.contains("260,000"),
            "{err}"
        );
        // Listing refuses it too: the file is not one Rill loads.
        assert!(read_bytes(&bytes, true).is_err());
        let ok = byte_arrays(&[("tokenizer.ggml.token_type", MAX_ARRAY)]);
        let header = read_bytes(&ok, false).unwrap();
        match &header.metadata["tokenizer.ggml.token_type"] {
            Value::Array(items) => assert_eq!(items.len() as u64, MAX_ARRAY),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn metadata_past_its_total_is_refused_and_listing_holds_no_array_issue_40() {
        // Five arrays of a million bytes: a 5 MB file that held would take 160 MB.
        let arrays: Vec<(String, u64)> = (0..5).map(|i| (format!("x.a{i}"), MAX_ARRAY)).collect();
        let named: Vec<(&str, u64)> = arrays.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        let bytes = byte_arrays(&named);
        let err = read_bytes(&bytes, false).unwrap_err().to_string();
        assert!(err.contains("more than") && err.contains("values"), "{err}");
        // A listing checks them and holds none.
        let header = read_bytes(&bytes, true).unwrap();
        for (k, _) in &named {
            assert!(
                matches!(&header.metadata[*k], Value::Array(a) if a.is_empty()),
                "{k}"
            );
        }
        assert_eq!(
            header.metadata["general.architecture"].to_string().unwrap(),
            "llama"
        );
        // A listing still refuses a truncated array.
        let cut = &bytes[..bytes.len() - 10];
        assert!(read_bytes(cut, true).is_err());
    }
}
