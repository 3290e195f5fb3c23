//! Sampling a token from logits, shared by generator plugins.

/// Sample a token from `logits` at `temperature` with nucleus `top_p`, using `u`, a uniform
/// random number in [0, 1). Returns the token and its log-probability under the tempered,
/// untruncated distribution (what the trainer recomputes). A temperature of 0 (or below)
/// picks the first token of highest logit and reports its logprob at temperature 1.
pub fn sample(logits: &[f32], temperature: f32, top_p: f32, u: f64) -> (u32, f32) {
    assert!(!logits.is_empty(), "sampling from an empty vocabulary");
    let greedy = temperature <= 0.0;
    let t = if greedy { 1.0 } else { f64::from(temperature) };
    let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l) / t).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log_z = max + scaled.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
    let logprobs: Vec<f64> = scaled.iter().map(|s| s - log_z).collect();
    let token = if greedy {
        let mut best = 0;
        for (i, lp) in logprobs.iter().enumerate() {
            if *lp > logprobs[best] {
                best = i;
            }
        }
        best
    } else {
        // the smallest set of most likely tokens whose mass reaches top_p
        let mut order: Vec<usize> = (0..logprobs.len()).collect();
        order.sort_by(|&a, &b| logprobs[b].total_cmp(&logprobs[a]));
        let mut kept = Vec::new();
        let mut mass = 0.0;
        for &i in &order {
            kept.push(i);
            mass += logprobs[i].exp();
            if mass >= f64::from(top_p) {
                break;
            }
        }
        let mut left = u.clamp(0.0, 1.0) * mass;
        let mut chosen = *kept.last().expect("at least one token is kept");
        for &i in &kept {
            left -= logprobs[i].exp();
            if left <= 0.0 {
                chosen = i;
                break;
            }
        }
        chosen
    };
    (token as u32, logprobs[token] as f32)
}

#[cfg(test)]
mod tests {
    use super::sample;

    #[test]
    fn greedy_temperature_and_nucleus() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let (t, lp) = sample(&logits, 0.0, 1.0, 0.99);
        assert_eq!(t, 1, "first of the maximal logits");
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(lp) - (3.0 - z.ln())).abs() < 1e-6);
        // u walks the distribution in descending order: 1, 3, 2, 0
        assert_eq!(sample(&logits, 1.0, 1.0, 0.0).0, 1);
        assert_eq!(sample(&logits, 1.0, 1.0, 0.999).0, 0);
        // top_p 0.5 keeps only the two most likely tokens
        assert_eq!(sample(&logits, 1.0, 0.5, 0.999).0, 3);
        // the reported logprob is that of the tempered, untruncated distribution
        let (t, lp) = sample(&logits, 0.5, 0.5, 0.999);
        let z: f64 = logits.iter().map(|&l| (f64::from(l) / 0.5).exp()).sum();
        assert!((f64::from(lp) - (f64::from(logits[t as usize]) / 0.5 - z.ln())).abs() < 1e-6);
    }
}
