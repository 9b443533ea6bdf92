//! Reading a model's weights from its GGUF file into a [`Decoder`]: the configuration, the
//! RoPE tables (each rope base's, YaRN's where the file has it), the embeddings, every layer's
//! matrices (grouped where they read the same input), norms and biases, and the output.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::attention::Rope;
use super::backend::RopeTable;
use super::decoder::{Beside, Decoder, DecoderConfig, Ffn, Layer};
use super::delta::DeltaNet;
use super::experts::Experts;
use super::kv_rows::KvType;
use super::parts::{
    Bias, Embedding, Group, Linear, Norm, PerLayerInputs, PerLayerStep, SharedExpert,
};
use super::table::{self, Part};
use super::tensors::{raw_tensor, RawTensor, TensorSource};
use crate::error::{candle_message, Error, Result};

/// The RoPE angles of every position for `base` and a position scale (`1`: none), each pair's
/// frequency divided by its `factors` where the file has them, cos and sin multiplied by the
/// file's attention factor, or YaRN's angles and factor where it has `yarn`; on `device` and,
/// when `host`, as our attention's table.
fn rope_table(
    cfg: &DecoderConfig,
    rope_dim: usize,
    (base, scale): (f32, f32),
    factors: Option<&[f32]>,
    yarn: Option<&super::config::Yarn>,
    device: &Device,
    host: bool,
) -> Result<RopeTable> {
    let inv_freq: Vec<f32> = (0..rope_dim)
        .step_by(2)
        .enumerate()
        .map(|(pair, i)| {
            let f = 1f32 / base.powf(i as f32 / rope_dim as f32);
            match factors {
                Some(by) => f / by[pair],
                None => f,
            }
        })
        .collect();
    let n = inv_freq.len();
    if let Some(y) = yarn {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..cfg.context_length {
            for (i, f) in inv_freq.iter().enumerate() {
                let (c, s) = y.cos_sin(rope_dim, base, i, p as f32 * f);
                cos.push(c);
                sin.push(s);
            }
        }
        let shape = (cfg.context_length, n);
        let neox = cfg.family.rope == super::family::RopeStyle::Neox;
        return Ok(RopeTable {
            cos: Tensor::from_slice(&cos, shape, device)?,
            sin: Tensor::from_slice(&sin, shape, device)?,
            host: host.then_some(Rope {
                cos,
                sin,
                pairs: n,
                neox,
            }),
        });
    }
    let inv_freq = Tensor::from_vec(inv_freq, (1, n), device)?;
    let mut pos = Tensor::arange(0u32, cfg.context_length as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((cfg.context_length, 1))?;
    if scale != 1.0 {
        pos = (pos * scale as f64)?;
    }
    let freqs = pos.matmul(&inv_freq)?;
    let (mut cos, mut sin) = (freqs.cos()?, freqs.sin()?);
    if cfg.rope_attn_factor != 1.0 {
        let a = cfg.rope_attn_factor as f64;
        (cos, sin) = ((cos * a)?, (sin * a)?);
    }
    let host = match host {
        true => Some(Rope {
            cos: cos.flatten_all()?.to_vec1()?,
            sin: sin.flatten_all()?.to_vec1()?,
            pairs: rope_dim / 2,
            neox: cfg.family.rope == super::family::RopeStyle::Neox,
        }),
        false => None,
    };
    Ok(RopeTable { cos, sin, host })
}

impl Decoder {
    /// Reads the weights of a llama-family GGUF. `context_length` caps the positions (and so
    /// the RoPE tables and the largest cache).
    pub(crate) fn from_gguf<R: std::io::Read + std::io::Seek>(
        ct: &crate::gguf::Header,
        source: TensorSource<'_, R>,
        device: &Device,
        family: super::family::Family,
        context_cap: Option<usize>,
        path: &Path,
        compute: super::Compute,
    ) -> Result<Self> {
        let (cfg, rope_dim) = DecoderConfig::read(ct, family, context_cap, path)?;
        // Rill's own forward pass (plain buffers, our kernels and attention) on the CPU; else
        // candle's tensors (GPUs, and the CPU when asked, to test that path).
        // (Every layer's RoPE width was checked against its heads: `heads.rs`.)
        let host = device.is_cpu() && compute == super::Compute::Ours;
        if let Some(why) = family.host_only().filter(|_| !host) {
            return Err(Error::model_file(
                path,
                format!(
                    "{} runs on the CPU only for now ({why}); load it on the CPU",
                    super::family::label(family.arch)
                ),
            ));
        }
        let mut source = source;
        let failed = |name: &str, e: candle_core::Error| {
            Error::model_file(path, format!("tensor `{name}`: {}", candle_message(&e)))
        };
        // A tensor as the file holds it: our kernels make their layout from its bytes, and
        // what candle runs is made a candle tensor (`qtensor`).
        let mut raw =
            |name: &str| raw_tensor(ct, &mut source, name, device).map_err(|e| failed(name, e));
        let factors: Option<Vec<f32>> = match &cfg.rope_factors {
            Some(name) => Some(
                raw(name)?
                    .qtensor()?
                    .dequantize(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1()?,
            ),
            None => None,
        };
        if factors
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| !(x.is_finite() && *x > 0.0)))
        {
            return Err(Error::model_file(
                path,
                "RoPE factors that are not positive numbers",
            ));
        }
        // M-RoPE's pairs that text leaves unturned: no frequency.
        let factors = match cfg.rope_sections {
            Some(sections) => {
                let mut f = factors.unwrap_or_else(|| vec![1.0; rope_dim / 2]);
                for (pair, f) in f.iter_mut().enumerate() {
                    if !super::config::text_turns(sections, cfg.family.mrope, pair) {
                        *f = f32::INFINITY;
                    }
                }
                Some(f)
            }
            None => factors,
        };
        let global = (cfg.rope_base, cfg.rope_scale);
        let windowed = (cfg.rope_base_swa, cfg.rope_scale_swa);
        let f = factors.as_deref();
        let yarn = cfg.yarn.as_ref();
        let mut ropes = vec![rope_table(&cfg, rope_dim, global, f, yarn, device, host)?];
        let swa_heads = cfg
            .windows
            .iter()
            .zip(&cfg.heads)
            .find(|(w, _)| w.is_some());
        if let (true, Some((_, h))) = (family.swa_heads, swa_heads) {
            // Gemma 4's windowed layers: their own RoPE width and base, no frequency factors.
            ropes.push(rope_table(
                &cfg, h.rope_dim, windowed, None, None, device, host,
            )?);
        } else if windowed != global && cfg.windows.iter().any(Option::is_some) {
            // The windowed layers' own base is unscaled (Gemma 3), or scaled as the global
            // layers' are (linear: `windowed` says so; YaRN: the same scaling).
            let same = family
                .sliding_window
                .is_some_and(|w| w.default_base.is_none());
            let yarn = yarn.filter(|_| same);
            ropes.push(rope_table(&cfg, rope_dim, windowed, f, yarn, device, host)?);
        }
        let embed_raw = raw("token_embd.weight")?;
        let tied = !ct.tensor_infos.contains_key("output.weight");
        // The lookup table stays quantised where our kernels read its format: rows are
        // dequantised as tokens come. When the output projection is the same matrix (tied), the
        // output layer's copy serves both.
        let ours = host && crate::kernels::QLinear::supports_raw(embed_raw.dtype, &embed_raw.dims);
        let table = |t: &RawTensor| -> Result<Embedding> {
            Ok(Embedding::Table(t.qtensor()?.dequantize(device)?))
        };
        let embed = match (ours, tied) {
            (true, true) => Embedding::Tied,
            (true, false) => {
                let isa = crate::kernels::Isa::detect();
                let t = &embed_raw;
                // Read in the map where the format allows: a lookup reads a few rows.
                let q = crate::kernels::QLinear::from_raw_in(
                    t.dtype,
                    &t.dims,
                    &t.bytes,
                    isa,
                    t.map(),
                    true,
                );
                match q {
                    Some(q) => Embedding::Quantized(q),
                    None => table(t)?,
                }
            }
            (false, _) => table(&embed_raw)?,
        };
        let per_layer = match cfg.per_layer_input {
            0 => None,
            width => Some(Box::new(per_layer_inputs(
                &cfg, &mut raw, width, host, path,
            )?)),
        };
        let norm = Norm::new(
            raw("output_norm.weight")?.qtensor()?,
            cfg.rms_eps,
            host,
            cfg.family.llama_cpp_rounding,
        )?;
        // Small models tie the output projection to the embedding.
        let output = match tied {
            false => {
                drop(embed_raw);
                Linear::new(raw("output.weight")?, host)?
            }
            true => Linear::new(embed_raw, host)?,
        };

        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let rope = match cfg.windows[i] {
                Some(_) => ropes.len() - 1,
                None => 0,
            };
            layers.push(read_layer(&cfg, ct, i, &mut raw, host, device, rope)?);
        }
        // Layer by layer, the output last: popped from the end, the first layer's come first.
        let mut pending_panels: Vec<_> = output.later().into_iter().collect();
        for l in layers.iter().rev() {
            if let Ffn::Dense { gate_up, down } = &l.ffn {
                pending_panels.extend(down.later());
                pending_panels.extend(gate_up.later());
            }
            if let Some(s) = &l.shared {
                pending_panels.extend(s.down.later());
                pending_panels.extend(s.gate_up.later());
            }
            if let Some(p) = &l.per_layer {
                pending_panels.extend(p.proj.later());
                pending_panels.extend(p.gate.later());
            }
            pending_panels.extend(l.wo.later());
            pending_panels.extend(l.qkv.later());
        }
        if let Some(p) = &per_layer {
            pending_panels.extend(p.proj.later());
        }
        Ok(Decoder {
            cfg,
            embed,
            per_layer,
            layers,
            norm,
            output,
            ropes,
            host,
            kv_type: KvType::F16,
            device: device.clone(),
            workspace: Default::default(),
            pending_panels,
            locked: Vec::new(),
        })
    }
}

/// Gemma 4's per-layer inputs (`table.rs`: their tensors, whose shapes are checked): the
/// table read in the file's map, as the embedding is, where our kernels read its format (a
/// real file's table is billions of values: a copy in f32 would not fit), else a named error.
fn per_layer_inputs<'a>(
    cfg: &DecoderConfig,
    raw: &mut impl FnMut(&str) -> Result<RawTensor<'a>>,
    width: usize,
    host: bool,
    path: &Path,
) -> Result<PerLayerInputs> {
    let t = raw(table::PER_LAYER_TABLE)?;
    let isa = crate::kernels::Isa::detect();
    let map = t.map();
    let table = crate::kernels::QLinear::from_raw_in(t.dtype, &t.dims, &t.bytes, isa, map, true)
        .ok_or_else(|| {
            Error::model_file(
                path,
                format!(
                    "`{}` is {:?}, a format Rill does not read per-layer embeddings in",
                    table::PER_LAYER_TABLE,
                    t.dtype
                ),
            )
        })?;
    Ok(PerLayerInputs {
        table,
        proj: Linear::new(raw(table::PER_LAYER_PROJ)?, host)?,
        norm: Norm::new(
            raw(table::PER_LAYER_NORM)?.qtensor()?,
            cfg.rms_eps,
            host,
            cfg.family.llama_cpp_rounding,
        )?,
        width,
    })
}

/// A layer's mixture beside its MLP (Gemma 4 26B-A4B: `decoder::Beside`), its tensors read
/// through `get` as `form` lays them out.
fn beside<'a>(
    cfg: &DecoderConfig,
    e: super::config::ExpertsConfig,
    gating: super::family::Gating,
    form: table::Form,
    get: &mut impl FnMut(Part) -> Result<RawTensor<'a>>,
    host: bool,
) -> Result<Beside> {
    let like_ggml = cfg.family.llama_cpp_rounding;
    let norm = |t: RawTensor| Norm::new(t.qtensor()?, cfg.rms_eps, host, like_ggml);
    let gate_up = match form.fused_experts {
        true => vec![get(Part::GateUpExps)?],
        false => vec![get(Part::GateExps)?, get(Part::UpExps)?],
    };
    let activation = cfg.family.activation;
    let experts = Experts::new(
        get(Part::Router)?,
        gate_up,
        get(Part::DownExps)?,
        None,
        e,
        gating,
        activation,
        host,
    )?;
    let experts = match form.expert_scales {
        true => experts.with_scales(floats(get(Part::DownExpsScale)?)?),
        false => experts,
    };
    // llama.cpp's router input: the plain norm, times `1/√width`, times the scale; here one
    // norm whose weights are the scale's values times `1/√width`.
    let by = 1.0 / (cfg.hidden as f32).sqrt();
    let weights: Vec<f32> = floats(get(Part::RouterScale)?)?
        .into_iter()
        .map(|s| s * by)
        .collect();
    let n = weights.len();
    let weights = Tensor::from_vec(weights, n, &Device::Cpu)?;
    let router_norm = Norm::new(
        candle_core::quantized::QTensor::quantize(
            &weights,
            candle_core::quantized::GgmlDType::F32,
        )?,
        cfg.rms_eps,
        host,
        like_ggml,
    )?;
    Ok(Beside {
        experts,
        pre: norm(get(Part::PreFfnNorm2)?)?,
        post_mlp: norm(get(Part::PostFfnNorm1)?)?,
        post_experts: norm(get(Part::PostFfnNorm2)?)?,
        router_norm,
    })
}

/// A vector of the file (a bias, sinks) as f32.
fn floats(t: RawTensor) -> Result<Vec<f32>> {
    Ok(t.qtensor()?
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1()?)
}

/// Layer `i`'s weights: the tensors its family's settings name (`table.rs`), read through
/// `raw`; `rope` is the layer's RoPE table.
fn read_layer<'a>(
    cfg: &DecoderConfig,
    ct: &crate::gguf::Header,
    i: usize,
    raw: &mut impl FnMut(&str) -> Result<RawTensor<'a>>,
    host: bool,
    device: &Device,
    rope: usize,
) -> Result<Layer> {
    let family = &cfg.family;
    let experts = cfg.experts.zip(family.experts);
    let recurrent = cfg.recurrent[i];
    let kind = table::Kind {
        recurrent,
        shares_kv: cfg.kv_layer[i] != i,
        per_layer: cfg.per_layer_input > 0,
    };
    let form = table::form(ct, family, i, kind);
    let parts = table::parts(family, form, experts.is_some());
    let has = |p: Part| parts.contains(&p);
    let mut get = |p: Part| raw(&p.tensor(family, i));
    let norm = |t: RawTensor| -> Result<Norm> {
        Norm::new(t.qtensor()?, cfg.rms_eps, host, family.llama_cpp_rounding)
    };
    let (qw, kw) = (cfg.heads[i].q_width(), cfg.heads[i].kv_width());
    let (qkv, wo, delta) = match (cfg.delta, recurrent) {
        // `DecoderConfig::read` gives a hybrid family its sizes.
        (Some(d), true) => {
            let mix = [Part::Mix, Part::MixGate, Part::SsmBeta, Part::SsmAlpha];
            let mix = mix.into_iter().map(&mut get).collect::<Result<Vec<_>>>()?;
            let net = DeltaNet {
                cfg: d,
                conv: floats(get(Part::SsmConv)?)?,
                dt: floats(get(Part::SsmDt)?)?,
                a: floats(get(Part::SsmA)?)?,
                norm: norm(get(Part::SsmNorm)?)?,
                eps: cfg.rms_eps as f32,
            };
            let wo = Linear::new(get(Part::SsmOut)?, host)?;
            (Group::new(mix, host)?, wo, Some(Box::new(net)))
        }
        _ => {
            let qkv = match has(Part::Qkv) {
                true => {
                    let q = if family.gated_query { 2 * qw } else { qw };
                    Group::fused(get(Part::Qkv)?, vec![q, kw, kw], host)?
                }
                // Values that are the keys' projection: q and k only (`Backend::keys_as_values`).
                false if form.keys_as_values => {
                    Group::new(vec![get(Part::Q)?, get(Part::K)?], host)?
                }
                // A layer that reads another's keys and values: queries only.
                false if form.shares_kv => Group::new(vec![get(Part::Q)?], host)?,
                false => Group::new(vec![get(Part::Q)?, get(Part::K)?, get(Part::V)?], host)?,
            };
            (qkv, Linear::new(get(Part::Out)?, host)?, None)
        }
    };
    let wo_bias = match has(Part::OutBias) {
        true => Some(floats(get(Part::OutBias)?)?),
        false => None,
    };
    let sinks = match has(Part::Sinks) {
        true => Some(floats(get(Part::Sinks)?)?),
        false => None,
    };
    // A mixture beside the MLP is read below (`beside`).
    let routed = experts.filter(|_| !family.experts_beside_mlp);
    let ffn = match routed {
        Some((e, gating)) => {
            let biases = match has(Part::RouterBias) {
                false => None,
                true => Some(super::experts::ExpertBiases {
                    router: floats(get(Part::RouterBias)?)?,
                    gate: floats(get(Part::GateExpsBias)?)?,
                    up: floats(get(Part::UpExpsBias)?)?,
                    down: floats(get(Part::DownExpsBias)?)?,
                }),
            };
            Ffn::Experts(Box::new(Experts::new(
                get(Part::Router)?,
                vec![get(Part::GateExps)?, get(Part::UpExps)?],
                get(Part::DownExps)?,
                biases,
                e,
                gating,
                family.activation,
                host,
            )?))
        }
        None => {
            let gate_up = match has(Part::Gate) {
                false => {
                    let up = get(Part::Up)?;
                    // `check_shapes` proved it `[2·ff, hidden]`.
                    let ff = up.dims[0] / 2;
                    Group::fused(up, vec![ff, ff], host)?
                }
                true => Group::new(vec![get(Part::Gate)?, get(Part::Up)?], host)?,
            };
            Ffn::Dense {
                gate_up,
                down: Linear::new(get(Part::Down)?, host)?,
            }
        }
    };
    let bias = match has(Part::QBias) {
        false => None,
        true => {
            let mut b = |p: Part| -> Result<Tensor> { Ok(get(p)?.qtensor()?.dequantize(device)?) };
            let (q, k, v) = (b(Part::QBias)?, b(Part::KBias)?, b(Part::VBias)?);
            let on_host = match host {
                true => Tensor::cat(&[&q, &k, &v], 0)?.to_vec1()?,
                false => Vec::new(),
            };
            Some(Bias {
                host: on_host,
                q,
                k,
                v,
            })
        }
    };
    let shared = match has(Part::SharedGate) {
        false => None,
        true => Some(Box::new(SharedExpert {
            gate_up: Group::new(vec![get(Part::SharedGate)?, get(Part::SharedUp)?], host)?,
            down: Linear::new(get(Part::SharedDown)?, host)?,
            gate: floats(get(Part::SharedRouter)?)?,
        })),
    };
    let beside = match (experts, form.beside) {
        (Some((e, gating)), true) => Some(Box::new(beside(cfg, e, gating, form, &mut get, host)?)),
        _ => None,
    };
    let (attn_norm, ffn_norm) = (norm(get(Part::AttnNorm)?)?, norm(get(Part::FfnNorm)?)?);
    let qk_norm = match (has(Part::QNorm), has(Part::KNorm)) {
        (false, _) => None,
        (true, false) => Some((norm(get(Part::QNorm)?)?, None)),
        (true, true) => Some((norm(get(Part::QNorm)?)?, Some(norm(get(Part::KNorm)?)?))),
    };
    let per_layer = match has(Part::PerLayerGate) {
        false => None,
        true => Some(Box::new(PerLayerStep {
            gate: Linear::new(get(Part::PerLayerGate)?, host)?,
            proj: Linear::new(get(Part::PerLayerProj)?, host)?,
            norm: norm(get(Part::PerLayerNorm)?)?,
        })),
    };
    let post_norms = match has(Part::PostAttnNorm) {
        false => None,
        true => Some((
            norm(get(Part::PostAttnNorm)?)?,
            norm(get(Part::PostFfnNorm)?)?,
        )),
    };
    let out_scale = match has(Part::LayerScale) {
        true => floats(get(Part::LayerScale)?)?.first().copied(),
        false => None,
    };
    Ok(Layer {
        qkv,
        keys_as_values: form.keys_as_values,
        out_scale,
        delta,
        bias,
        qk_norm,
        wo,
        wo_bias,
        sinks,
        ffn,
        shared,
        beside,
        post_norms,
        per_layer,
        rope,
        window: cfg.windows[i],
        attn_norm,
        ffn_norm,
    })
}
