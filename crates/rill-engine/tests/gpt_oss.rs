//! gpt-oss against llama.cpp (issue 18), on its test model (`scripts/make-test-models.py`:
//! q/k/v and output biases, a sink per head, 8 experts of which 2 are used, routed by a
//! softmax over the chosen with the router's bias, each a clamped SwiGLU with biases, every
//! other layer windowed, YaRN RoPE; the qwen2 vocabulary with harmony's tokens and the real
//! gpt-oss template), in its released form (experts in MXFP4, the rest Q8_0) and in F16, and
//! llama.cpp's logits and routes on the same files (`scripts/record-reference-logits.py`).
//! The router is checked in `tests/experts.rs` with the other mixtures'.

mod common;

use common::parity::parity_but;

/// The formats of the test model: the released files' (MXFP4 experts, Q8_0 elsewhere), F16.
pub const GPT_OSS: &[&str] = &["gpt-oss-test.MXFP4", "gpt-oss-test.F16"];

/// Known gap of the F16 file: its last position (70, top two 0.356 apart) goes through
/// another expert in layer 0, where llama.cpp's router has two logits 0.00036 apart
/// (`tests/experts.rs`). The MXFP4 file has none.
const F16_TIE: usize = 1;

#[test]
fn gpt_oss_matches_llama_cpp() {
    parity_but(GPT_OSS[0], 0);
    parity_but(GPT_OSS[1], F16_TIE);
}
