//! The tensors of a model file, named once: which ones each layer has under a family's
//! settings ([`parts`]), what each is called in the file ([`Part::tensor`]) and the shape it
//! must have ([`Part::shape`]). The shape check below and the loader (`load.rs`) both read
//! this table, so a setting's tensors are spelled in one place.
//!
//! Every weight's shape is checked against the metadata before anything is loaded, so a file
//! whose header disagrees with its tensors (a wrong head count, a truncated layer) fails with a
//! message, not with an index out of bounds on the first forward pass (issue 13). Shapes are
//! candle's: `[rows, columns]`, a linear layer being `[out, in]`.

use std::path::Path;

use super::config::{DeltaConfig, ExpertsConfig};
use super::family::Family;
use crate::error::{Error, Result};
use crate::gguf::Header;

/// Gemma 4's per-layer embeddings (E2B, E4B): every layer's embedding of each token, one row
/// per token; the projection of the residual stream to them; their norm.
pub(super) const PER_LAYER_TABLE: &str = "per_layer_token_embd.weight";
pub(super) const PER_LAYER_PROJ: &str = "per_layer_model_proj.weight";
pub(super) const PER_LAYER_NORM: &str = "per_layer_proj_norm.weight";

/// One tensor of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    AttnNorm,
    /// The norm before the feed-forward (`ffn_norm`, gpt-oss's `post_attention_norm`).
    FfnNorm,
    /// q, k and v in one tensor, where the file fused them.
    Qkv,
    Q,
    K,
    V,
    Out,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    OutBias,
    Sinks,
    PostAttnNorm,
    PostFfnNorm,
    Gate,
    /// The up projection, or gate and up in one tensor (`Family::fused_gate_up`).
    Up,
    Down,
    Router,
    GateExps,
    UpExps,
    DownExps,
    RouterBias,
    GateExpsBias,
    UpExpsBias,
    DownExpsBias,
    /// A mixture's shared expert: its gate, up and down projections, and the gate's logit.
    SharedGate,
    SharedUp,
    SharedDown,
    SharedRouter,
    /// A Gated DeltaNet layer's queries, keys and values before its convolution.
    Mix,
    /// Its output gate (`z`).
    MixGate,
    /// Its per-head write strength (`β` before its sigmoid) and decay input (`α`).
    SsmBeta,
    SsmAlpha,
    /// The convolution's taps, `[channels, taps]`.
    SsmConv,
    /// The decay's bias and `A` (`−exp(A_log)`, as converted).
    SsmDt,
    SsmA,
    /// The gated norm of each head's output.
    SsmNorm,
    /// The output projection.
    SsmOut,
    /// The layer's output scale (Gemma 4's `layer_output_scale`, one value).
    LayerScale,
    /// Gemma 4's per-layer embedding step: the gate from the residual stream to the layer's
    /// input width, the projection back, and its norm.
    PerLayerGate,
    PerLayerProj,
    PerLayerNorm,
    /// A mixture beside the MLP (Gemma 4 26B-A4B): every expert's gate and up in one tensor
    /// (the gate first), the router's scale per input value, each expert's output scale, the
    /// norm before the experts and those after the MLP and after the experts.
    GateUpExps,
    RouterScale,
    DownExpsScale,
    PreFfnNorm2,
    PostFfnNorm1,
    PostFfnNorm2,
}

/// The widths a layer's tensors follow.
#[derive(Clone, Copy)]
pub(super) struct Widths {
    pub(super) hidden: usize,
    /// Of all query heads (`n_head · head_dim`).
    pub(super) q: usize,
    /// Of all key (or value) heads.
    pub(super) kv: usize,
    pub(super) head: usize,
    /// Of the layer's own embedding of the token (Gemma 4's E2B and E4B; 0 without).
    pub(super) per_layer: usize,
}

/// What a layer's shapes are made of besides the widths: the feed-forward's width (0 in a
/// mixture) and the experts'.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub(super) widths: Widths,
    pub(super) ff: usize,
    pub(super) experts: Option<ExpertsConfig>,
    pub(super) fused_gate_up: bool,
    /// The query projection is twice as wide: queries and their gate (Qwen3.5).
    pub(super) gated_query: bool,
    pub(super) delta: Option<DeltaConfig>,
}

impl Part {
    /// Its name in the file, and whether it is a `weight` or a `bias` (or neither: `ssm_a`).
    fn name(self, family: &Family) -> (&'static str, &'static str) {
        use Part::*;
        match self {
            AttnNorm => ("attn_norm", "weight"),
            FfnNorm => (family.ffn_norm, "weight"),
            Qkv => ("attn_qkv", "weight"),
            Q => ("attn_q", "weight"),
            K => ("attn_k", "weight"),
            V => ("attn_v", "weight"),
            Out => ("attn_output", "weight"),
            QBias => ("attn_q", "bias"),
            KBias => ("attn_k", "bias"),
            VBias => ("attn_v", "bias"),
            QNorm => ("attn_q_norm", "weight"),
            KNorm => ("attn_k_norm", "weight"),
            OutBias => ("attn_output", "bias"),
            Sinks => ("attn_sinks", "weight"),
            PostAttnNorm => ("post_attention_norm", "weight"),
            PostFfnNorm => ("post_ffw_norm", "weight"),
            Gate => ("ffn_gate", "weight"),
            Up => ("ffn_up", "weight"),
            Down => ("ffn_down", "weight"),
            Router => ("ffn_gate_inp", "weight"),
            GateExps => ("ffn_gate_exps", "weight"),
            UpExps => ("ffn_up_exps", "weight"),
            DownExps => ("ffn_down_exps", "weight"),
            RouterBias => ("ffn_gate_inp", "bias"),
            GateExpsBias => ("ffn_gate_exps", "bias"),
            UpExpsBias => ("ffn_up_exps", "bias"),
            DownExpsBias => ("ffn_down_exps", "bias"),
            SharedGate => ("ffn_gate_shexp", "weight"),
            SharedUp => ("ffn_up_shexp", "weight"),
            SharedDown => ("ffn_down_shexp", "weight"),
            SharedRouter => ("ffn_gate_inp_shexp", "weight"),
            Mix => ("attn_qkv", "weight"),
            MixGate => ("attn_gate", "weight"),
            SsmBeta => ("ssm_beta", "weight"),
            SsmAlpha => ("ssm_alpha", "weight"),
            SsmConv => ("ssm_conv1d", "weight"),
            SsmDt => ("ssm_dt", "bias"),
            SsmA => ("ssm_a", ""),
            SsmNorm => ("ssm_norm", "weight"),
            SsmOut => ("ssm_out", "weight"),
            LayerScale => ("layer_output_scale", "weight"),
            PerLayerGate => ("inp_gate", "weight"),
            PerLayerProj => ("proj", "weight"),
            PerLayerNorm => ("post_norm", "weight"),
            GateUpExps => ("ffn_gate_up_exps", "weight"),
            RouterScale => ("ffn_gate_inp", "scale"),
            DownExpsScale => ("ffn_down_exps", "scale"),
            PreFfnNorm2 => ("pre_ffw_norm_2", "weight"),
            PostFfnNorm1 => ("post_ffw_norm_1", "weight"),
            PostFfnNorm2 => ("post_ffw_norm_2", "weight"),
        }
    }

    /// The tensor's name in layer `layer`: `blk.{layer}.attn_q.weight`.
    pub(super) fn tensor(self, family: &Family, layer: usize) -> String {
        match self.name(family) {
            (name, "") => format!("blk.{layer}.{name}"),
            (name, kind) => format!("blk.{layer}.{name}.{kind}"),
        }
    }

    /// The shape it must have.
    pub(super) fn shape(self, d: &Dims) -> Vec<usize> {
        use Part::*;
        let Widths {
            hidden,
            q,
            kv,
            head,
            per_layer,
        } = d.widths;
        let (count, eff, sff) = d
            .experts
            .map_or((0, 0, 0), |e| (e.count, e.ff, e.shared_ff));
        let delta = d.delta.unwrap_or(DeltaConfig {
            conv_kernel: 0,
            head: 0,
            k_heads: 0,
            v_heads: 0,
        });
        let (conv, values, v_heads) = (delta.conv_width(), delta.value_width(), delta.v_heads);
        match self {
            AttnNorm | FfnNorm | PostAttnNorm | PostFfnNorm | OutBias => vec![hidden],
            Qkv if d.gated_query => vec![2 * q + 2 * kv, hidden],
            Qkv => vec![q + 2 * kv, hidden],
            Q if d.gated_query => vec![2 * q, hidden],
            Q => vec![q, hidden],
            K | V => vec![kv, hidden],
            Out => vec![hidden, q],
            QBias => vec![q],
            KBias | VBias => vec![kv],
            QNorm | KNorm => vec![head],
            Sinks => vec![q / head],
            Gate => vec![d.ff, hidden],
            Up if d.fused_gate_up => vec![2 * d.ff, hidden],
            Up => vec![d.ff, hidden],
            Down => vec![hidden, d.ff],
            Router => vec![count, hidden],
            GateExps | UpExps => vec![count, eff, hidden],
            DownExps => vec![count, hidden, eff],
            RouterBias => vec![count],
            GateExpsBias | UpExpsBias => vec![count, eff],
            DownExpsBias => vec![count, hidden],
            SharedGate | SharedUp => vec![sff, hidden],
            SharedDown => vec![hidden, sff],
            SharedRouter => vec![hidden],
            Mix => vec![conv, hidden],
            MixGate => vec![values, hidden],
            SsmBeta | SsmAlpha => vec![v_heads, hidden],
            SsmConv => vec![conv, delta.conv_kernel],
            SsmDt | SsmA => vec![v_heads],
            SsmNorm => vec![delta.head],
            SsmOut => vec![hidden, values],
            LayerScale => vec![1],
            PerLayerGate => vec![per_layer, hidden],
            PerLayerProj => vec![hidden, per_layer],
            PerLayerNorm | RouterScale | PreFfnNorm2 | PostFfnNorm1 | PostFfnNorm2 => {
                vec![hidden]
            }
            GateUpExps => vec![count, 2 * eff, hidden],
            DownExpsScale => vec![count],
        }
    }
}

/// How a layer is laid out in the file, where a family allows more than one way.
#[derive(Clone, Copy, Debug)]
pub(super) struct Form {
    /// q, k and v in one tensor.
    pub(super) fused_qkv: bool,
    /// A Gated DeltaNet layer.
    pub(super) recurrent: bool,
    /// No `attn_v`: the values are the keys' projection (Gemma 4's global layers).
    pub(super) keys_as_values: bool,
    /// A `layer_output_scale` (Gemma 4).
    pub(super) scale: bool,
    /// Queries only: the layer reads an earlier layer's keys and values (Gemma 4's last
    /// layers in E2B and E4B).
    pub(super) shares_kv: bool,
    /// A per-layer embedding step (Gemma 4's E2B and E4B).
    pub(super) per_layer: bool,
    /// A mixture beside the MLP (Gemma 4 26B-A4B: the layer has a router), with every
    /// expert's gate and up in one tensor, and with each expert's output scale.
    pub(super) beside: bool,
    pub(super) fused_experts: bool,
    pub(super) expert_scales: bool,
}

/// How a layer is laid out as the configuration says: a recurrent layer, one that reads
/// another's keys and values, one with a per-layer embedding step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Kind {
    pub(super) recurrent: bool,
    pub(super) shares_kv: bool,
    pub(super) per_layer: bool,
}

/// How layer `layer` of the file is laid out (`kind`: what the configuration says of it).
pub(super) fn form(ct: &Header, family: &Family, layer: usize, kind: Kind) -> Form {
    let has = |p: Part| ct.tensor_infos.contains_key(&p.tensor(family, layer));
    let beside = family.experts_beside_mlp && has(Part::Router);
    let fused_qkv = !kind.shares_kv && has(Part::Qkv);
    Form {
        fused_qkv,
        recurrent: kind.recurrent,
        keys_as_values: family.v_norm && !fused_qkv && !kind.shares_kv && !has(Part::V),
        scale: family.layer_scale && has(Part::LayerScale),
        shares_kv: kind.shares_kv,
        per_layer: kind.per_layer,
        beside,
        fused_experts: beside && has(Part::GateUpExps),
        expert_scales: beside && has(Part::DownExpsScale),
    }
}

/// The tensors of a layer under `family`'s settings, laid out as `form` says: a Gated
/// DeltaNet's or attention's, and a mixture's experts or one gated MLP.
pub(super) fn parts(family: &Family, form: Form, experts: bool) -> Vec<Part> {
    use Part::*;
    let when = |on: bool, parts: &[Part]| if on { parts.to_vec() } else { Vec::new() };
    let mut p = vec![AttnNorm, FfnNorm];
    p.extend(when(form.scale, &[LayerScale]));
    p.extend(when(
        form.per_layer,
        &[PerLayerGate, PerLayerProj, PerLayerNorm],
    ));
    if form.recurrent {
        p.extend([
            Mix, MixGate, SsmBeta, SsmAlpha, SsmConv, SsmDt, SsmA, SsmNorm, SsmOut,
        ]);
        p.extend(feed_forward(family, form, experts));
        return p;
    }
    p.extend(when(family.out_bias, &[OutBias]));
    p.extend(when(family.attn_sinks, &[Sinks]));
    match (form.shares_kv, form.fused_qkv, form.keys_as_values) {
        (true, _, _) => p.push(Q),
        (_, true, _) => p.push(Qkv),
        (_, false, true) => p.extend([Q, K]),
        (_, false, false) => p.extend([Q, K, V]),
    }
    p.push(Out);
    p.extend(when(family.qkv_bias, &[QBias, KBias, VBias]));
    p.extend(when(family.qk_norm && form.shares_kv, &[QNorm]));
    p.extend(when(family.qk_norm && !form.shares_kv, &[QNorm, KNorm]));
    p.extend(when(family.post_norms, &[PostAttnNorm, PostFfnNorm]));
    p.extend(feed_forward(family, form, experts));
    p
}

/// The feed-forward's tensors: a mixture's experts, or one gated MLP, and a mixture beside
/// it where the layer has one.
fn feed_forward(family: &Family, form: Form, experts: bool) -> Vec<Part> {
    use Part::*;
    if family.experts_beside_mlp {
        let mut p = vec![Gate, Up, Down];
        if form.beside {
            p.extend([Router, RouterScale, DownExps]);
            p.extend([PreFfnNorm2, PostFfnNorm1, PostFfnNorm2]);
            match form.fused_experts {
                true => p.push(GateUpExps),
                false => p.extend([GateExps, UpExps]),
            }
            if form.expert_scales {
                p.push(DownExpsScale);
            }
        }
        return p;
    }
    match (experts, family.fused_gate_up) {
        (true, _) => {
            let mut p = vec![Router, GateExps, UpExps, DownExps];
            if family.expert_biases {
                p.extend([RouterBias, GateExpsBias, UpExpsBias, DownExpsBias]);
            }
            if family.shared_expert {
                p.extend([SharedGate, SharedUp, SharedDown, SharedRouter]);
            }
            p
        }
        (false, true) => vec![Up, Down],
        (false, false) => vec![Gate, Up, Down],
    }
}

/// Checks every weight's shape against the metadata before anything is loaded.
/// `layout`: a hybrid family's Gated DeltaNet sizes, which layers are recurrent (one flag per
/// layer), and the layer whose keys and values each reads.
pub(super) fn check_shapes(
    ct: &Header,
    path: &Path,
    family: Family,
    layer_widths: &[Widths],
    rope_dim: usize,
    experts: Option<ExpertsConfig>,
    (delta, recurrent, kv_layer): (Option<DeltaConfig>, &[bool], &[usize]),
) -> Result<()> {
    let n_layer = recurrent.len().min(layer_widths.len()).min(kv_layer.len());
    let Some(&first) = layer_widths.first() else {
        return Err(Error::model_file(path, "the model has no layers"));
    };
    let hidden = first.hidden;
    let dims = |name: &str| -> Result<&[usize]> {
        ct.tensor_infos
            .get(name)
            .map(|t| t.shape.dims())
            .ok_or_else(|| Error::model_file(path, format!("tensor `{name}` is missing")))
    };
    let expect_in = |w: Widths, name: &str, want: &[usize]| -> Result<()> {
        let got = dims(name)?;
        if got == want {
            return Ok(());
        }
        Err(Error::model_file(
            path,
            format!(
                "tensor `{name}` has shape {got:?}, but the metadata (width {hidden}, \
                 query width {}, key/value width {}) needs {want:?}",
                w.q, w.kv
            ),
        ))
    };
    let expect = |name: &str, want: &[usize]| expect_in(first, name, want);
    let vocab = match dims("token_embd.weight")? {
        [v, h] if *v > 0 && *h == hidden => *v,
        other => {
            return Err(Error::model_file(
                path,
                format!("tensor `token_embd.weight` has shape {other:?}; the width is {hidden}"),
            ))
        }
    };
    if ct.tensor_infos.contains_key("output.weight") {
        expect("output.weight", &[vocab, hidden])?;
    }
    expect("output_norm.weight", &[hidden])?;
    if n_layer == 0 {
        return Err(Error::model_file(path, "the model has no layers"));
    }
    // Gemma 4's factors cover its global layers' heads (the widest), of which RoPE may turn a
    // part; everyone else's the dimensions RoPE turns.
    let factors_len = match family.swa_heads {
        true => layer_widths.iter().map(|w| w.head).max().unwrap_or(0) / 2,
        false => rope_dim / 2,
    };
    for factors in ["rope_freqs", "rope_factors_long", "rope_factors_short"] {
        let name = format!("{factors}.weight");
        if ct.tensor_infos.contains_key(&name) {
            expect(&name, &[factors_len])?;
        }
    }
    let per_layer = first.per_layer;
    if per_layer > 0 {
        let all = per_layer.saturating_mul(n_layer);
        expect(PER_LAYER_TABLE, &[vocab, all])?;
        expect(PER_LAYER_PROJ, &[all, hidden])?;
        expect(PER_LAYER_NORM, &[per_layer])?;
    }
    for i in 0..n_layer {
        // The feed-forward width, read when its first tensor is checked: from the gate, or
        // with a fused gate-up from the down projection.
        let ff_width = || -> Result<usize> {
            let name = match family.fused_gate_up {
                true => Part::Down,
                false => Part::Gate,
            }
            .tensor(&family, i);
            match (dims(&name)?, family.fused_gate_up) {
                ([ff, h], false) | ([h, ff], true) if *ff > 0 && *h == hidden => Ok(*ff),
                (other, _) => Err(Error::model_file(
                    path,
                    format!("tensor `{name}` has shape {other:?}; the width is {hidden}"),
                )),
            }
        };
        let mut d = Dims {
            widths: layer_widths[i],
            ff: 0,
            experts,
            fused_gate_up: family.fused_gate_up,
            gated_query: family.gated_query,
            delta,
        };
        let kind = Kind {
            recurrent: recurrent[i],
            shares_kv: kv_layer[i] != i,
            per_layer: per_layer > 0,
        };
        let form = form(ct, &family, i, kind);
        for part in parts(&family, form, experts.is_some()) {
            if matches!(part, Part::Gate | Part::Up | Part::Down) && d.ff == 0 {
                d.ff = ff_width()?;
            }
            expect_in(d.widths, &part.tensor(&family, i), &part.shape(&d))?;
        }
    }
    Ok(())
}
