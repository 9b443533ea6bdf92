//! Crafting GGUF files byte by byte, for tests of what the loader does with bad ones: headers
//! that lie about their tensors, alignments of zero, types Rill does not run. (Test *models* are
//! written with gguf-py; these are deliberately broken files no converter would write.)

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;

/// A tensor as GGUF stores it: dimensions fastest-moving first, a ggml type id, its bytes.
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// A GGUF file to write: version 3, metadata in the given order, tensors packed and aligned.
pub struct Craft {
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<RawTensor>,
    /// The padding actually used (whatever `general.alignment` in the metadata claims).
    pub alignment: usize,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => string(out, s),
        Value::Array(items) => {
            let item = items.first().map_or(4, type_id);
            out.extend(item.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for i in items {
                value(out, i);
            }
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl Craft {
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            string(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            value(&mut out, v);
        }
        let align = |n: usize| n.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0usize;
        for t in &self.tensors {
            string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend((offset as u64).to_le_bytes());
            offset = align(offset + t.data.len());
        }
        out.resize(align(out.len()), 0);
        for t in &self.tensors {
            out.extend(&t.data);
            out.resize(align(out.len()), 0);
        }
        out
    }
}

/// ggml's id of a type candle reads.
pub fn ggml_id(t: GgmlDType) -> u32 {
    match t {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

/// The GGUF file at `path`, read back as a [`Craft`] (metadata sorted by key), so a test can
/// change its header and write it again with the same tensors.
pub fn read(path: &std::path::Path) -> Craft {
    let bytes = std::fs::read(path).unwrap();
    let mut cursor = std::io::Cursor::new(&bytes);
    let content = rill_engine::model::gguf::read(&mut cursor, bytes.len() as u64).unwrap();
    let mut metadata: Vec<(String, Value)> = content.metadata.into_iter().collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let mut tensors: Vec<_> = content.tensor_infos.into_iter().collect();
    tensors.sort_by_key(|(_, t)| t.offset);
    let tensors = tensors
        .into_iter()
        .map(|(name, t)| {
            let dims: Vec<usize> = t.shape.dims().iter().rev().copied().collect();
            let size = rill_engine::model::gguf::tensor_bytes(&dims, t.dtype).unwrap();
            let start = (content.tensor_data_offset + t.offset) as usize;
            RawTensor {
                name,
                dims: dims.iter().map(|&d| d as u64).collect(),
                type_id: match t.dtype {
                    rill_engine::kernels::TensorType::Ggml(d) => ggml_id(d),
                    rill_engine::kernels::TensorType::Mxfp4 => 39,
                },
                data: bytes[start..start + size as usize].to_vec(),
            }
        })
        .collect();
    Craft {
        metadata,
        tensors,
        alignment: 32,
    }
}

/// Replaces (or adds) one metadata entry.
pub fn set(craft: &mut Craft, key: &str, v: Value) {
    match craft.metadata.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v,
        None => craft.metadata.push((key.to_owned(), v)),
    }
}

/// A small, valid llama-shaped model (zero weights): metadata of every value type, one layer.
pub fn small() -> Craft {
    let s = |v: &str| Value::String(v.into());
    Craft {
        metadata: vec![
            ("general.architecture".into(), s("llama")),
            ("general.alignment".into(), Value::U32(32)),
            ("general.name".into(), s("tiny")),
            ("llama.context_length".into(), Value::U32(64)),
            ("llama.embedding_length".into(), Value::U32(32)),
            ("llama.block_count".into(), Value::U32(1)),
            ("llama.attention.head_count".into(), Value::U32(2)),
            ("llama.rope.freq_base".into(), Value::F32(10000.0)),
            ("llama.some_i64".into(), Value::I64(-3)),
            ("llama.some_f64".into(), Value::F64(0.5)),
            ("llama.some_bool".into(), Value::Bool(true)),
            ("llama.some_u8".into(), Value::U8(7)),
            ("llama.some_i16".into(), Value::I16(-7)),
            ("tokenizer.ggml.model".into(), s("gpt2")),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(vec![s("a"), s("b"), s("ab"), s("<s>")]),
            ),
            ("tokenizer.ggml.merges".into(), Value::Array(vec![s("a b")])),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(vec![
                    Value::I32(1),
                    Value::I32(1),
                    Value::I32(1),
                    Value::I32(3),
                ]),
            ),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(3)),
            (
                "tokenizer.chat_template".into(),
                s("{{ messages[0]['content'] }}"),
            ),
        ],
        tensors: [
            ("token_embd.weight", vec![32, 4]),
            ("output_norm.weight", vec![32]),
            ("blk.0.attn_norm.weight", vec![32]),
            ("blk.0.ffn_norm.weight", vec![32]),
            ("blk.0.attn_q.weight", vec![32, 32]),
            ("blk.0.attn_k.weight", vec![32, 32]),
            ("blk.0.attn_v.weight", vec![32, 32]),
            ("blk.0.attn_output.weight", vec![32, 32]),
            ("blk.0.ffn_gate.weight", vec![32, 64]),
            ("blk.0.ffn_up.weight", vec![32, 64]),
            ("blk.0.ffn_down.weight", vec![64, 32]),
        ]
        .into_iter()
        .map(|(name, dims): (&str, Vec<u64>)| RawTensor {
            name: name.into(),
            data: vec![0; 4 * dims.iter().product::<u64>() as usize],
            dims,
            type_id: 0,
        })
        .collect(),
        alignment: 32,
    }
}
