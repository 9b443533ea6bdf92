//! The sampler's tests: each stage of the pipeline, seeds, validation and live changes.

use super::*;

fn logits() -> Vec<f32> {
    vec![1.0, 3.0, 2.5, 0.5, -1.0, 2.9]
}

#[test]
fn greedy_takes_the_highest_logit_and_the_lowest_id_on_ties() {
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    assert_eq!(s.sample(&mut logits(), &[]).unwrap(), 1);
    assert_eq!(s.sample(&mut [0.0, 5.0, 5.0], &[]).unwrap(), 1);
}

#[test]
fn repeat_penalty_can_change_the_greedy_choice() {
    let mut s = Sampler::new(SamplingParams {
        repeat_penalty: 1.5,
        ..SamplingParams::greedy()
    })
    .unwrap();
    // Token 1 (3.0) was just said: 3.0 / 1.5 = 2.0 < 2.9.
    assert_eq!(s.sample(&mut logits(), &[1]).unwrap(), 5);
}

#[test]
fn frequency_penalty_counts_occurrences() {
    let p = SamplingParams {
        frequency_penalty: 0.2,
        ..SamplingParams::greedy()
    };
    let mut s = Sampler::new(p).unwrap();
    // 3.0 - 0.2 = 2.8 < 2.9: once is enough to flip it to token 5.
    assert_eq!(s.sample(&mut logits(), &[1]).unwrap(), 5);
    // Tokens 1 and 5 said three times each: 2.4 and 2.3, token 2 (2.5) wins.
    assert_eq!(s.sample(&mut logits(), &[1, 1, 1, 5, 5, 5]).unwrap(), 2);
}

#[test]
fn same_seed_same_tokens_other_seed_other_tokens() {
    let p = SamplingParams {
        temperature: 1.5,
        top_k: None,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(42),
        ..Default::default()
    };
    let draw = |p: SamplingParams| {
        let mut s = Sampler::new(p).unwrap();
        (0..64)
            .map(|_| s.sample(&mut logits(), &[]).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(p.clone()), draw(p.clone()));
    assert_ne!(
        draw(p.clone()),
        draw(SamplingParams {
            seed: Some(43),
            ..p
        })
    );
}

#[test]
fn sampling_frequencies_follow_the_softmax() {
    // logits ln(1), ln(2), ln(3), ln(4): probabilities 0.1, 0.2, 0.3, 0.4 at temperature 1.
    let base: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
    let p = SamplingParams {
        temperature: 1.0,
        top_k: None,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(7),
        ..Default::default()
    };
    let mut s = Sampler::new(p).unwrap();
    let mut counts = [0usize; 4];
    let n = 20_000;
    for _ in 0..n {
        counts[s.sample(&mut base.clone(), &[]).unwrap() as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let expected = (i + 1) as f64 / 10.0;
        let got = c as f64 / n as f64;
        assert!(
            (got - expected).abs() < 0.015,
            "token {i}: {got} vs {expected}"
        );
    }
}

#[test]
fn top_k_top_p_and_min_p_restrict_the_candidates() {
    let base: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
    let seen = |p: SamplingParams| {
        let mut s = Sampler::new(SamplingParams {
            seed: Some(1),
            temperature: 1.0,
            ..p
        })
        .unwrap();
        let mut set = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            set.insert(s.sample(&mut base.clone(), &[]).unwrap());
        }
        set.into_iter().collect::<Vec<_>>()
    };
    let off = SamplingParams {
        top_k: None,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    };
    assert_eq!(seen(off.clone()), vec![0, 1, 2, 3]);
    assert_eq!(
        seen(SamplingParams {
            top_k: Some(2),
            ..off.clone()
        }),
        vec![2, 3]
    );
    // 0.4 + 0.3 = 0.7 reaches top-p 0.6: tokens 3 and 2.
    assert_eq!(
        seen(SamplingParams {
            top_p: 0.6,
            ..off.clone()
        }),
        vec![2, 3]
    );
    // min-p 0.5 of 0.4 = 0.2: tokens with p ≥ 0.2 are 1, 2, 3.
    assert_eq!(
        seen(SamplingParams {
            min_p: 0.5,
            ..off.clone()
        }),
        vec![1, 2, 3]
    );
}

#[test]
fn low_temperature_concentrates_high_temperature_spreads() {
    let base: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
    let share_of_top = |t: f32| {
        let p = SamplingParams {
            temperature: t,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(3),
            ..Default::default()
        };
        let mut s = Sampler::new(p).unwrap();
        (0..5000)
            .filter(|_| s.sample(&mut base.clone(), &[]).unwrap() == 3)
            .count()
    };
    assert!(share_of_top(0.2) > share_of_top(1.0));
    assert!(share_of_top(1.0) > share_of_top(5.0));
}

#[test]
fn invalid_values_are_rejected_naming_the_field() {
    let bad = [
        (
            SamplingParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: -0.5,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 2.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_k: Some(0),
                ..Default::default()
            },
            "top_k",
        ),
        (
            SamplingParams {
                min_p: 1.5,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingParams {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            "repeat_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: f32::INFINITY,
                ..Default::default()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: 3.0,
                ..Default::default()
            },
            "frequency_penalty",
        ),
    ];
    for (p, field) in bad {
        match Sampler::new(p) {
            Err(Error::InvalidParam { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidParam, got {other:?}"),
        }
    }
    assert!(Sampler::new(SamplingParams::default()).is_ok());
}

#[test]
fn set_params_applies_to_the_next_draw() {
    let p = SamplingParams {
        temperature: 5.0,
        top_k: None,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(9),
        ..Default::default()
    };
    let mut s = Sampler::new(p).unwrap();
    s.set_params(SamplingParams::greedy()).unwrap();
    for _ in 0..20 {
        assert_eq!(s.sample(&mut logits(), &[]).unwrap(), 1);
    }
    assert!(s
        .set_params(SamplingParams {
            top_p: f32::NAN,
            ..Default::default()
        })
        .is_err());
    assert_eq!(
        s.params(),
        &SamplingParams::greedy(),
        "a rejected change leaves the old settings"
    );
}

#[test]
fn nan_logits_are_an_error_not_a_token() {
    let mut s = Sampler::new(SamplingParams::default()).unwrap();
    assert!(s.sample(&mut [0.0, f32::NAN], &[]).is_err());
}

#[test]
fn explained_sampling_reports_raw_and_sampled_probabilities() {
    // Greedy: the likeliest token is drawn with certainty; raw is the plain softmax.
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    let (drawn, c) = s
        .sample_explained(&mut [1.0, 3.0, 2.0, 0.0], &[], 2)
        .unwrap();
    assert_eq!(drawn, 1);
    assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 2]);
    let total: f32 = [1.0f32, 3.0, 2.0, 0.0]
        .iter()
        .map(|l| (l - 3.0).exp())
        .sum();
    assert!((c[0].raw - 1.0 / total).abs() < 1e-6);
    assert_eq!((c[0].sampled, c[1].sampled), (1.0, 0.0));

    // top-k 1 at temperature 1: only the likeliest survives; the rest have 0.
    let params = SamplingParams {
        temperature: 1.0,
        top_k: Some(1),
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(1),
        ..Default::default()
    };
    let mut s = Sampler::new(params).unwrap();
    let (drawn, c) = s
        .sample_explained(&mut [1.0, 3.0, 2.0, 0.0], &[], 3)
        .unwrap();
    assert_eq!(drawn, 1);
    assert_eq!(
        c.iter().map(|c| c.sampled).collect::<Vec<_>>(),
        [1.0, 0.0, 0.0]
    );
    let raw_sum: f32 = c.iter().map(|c| c.raw).sum();
    assert!(raw_sum < 1.0);
}
