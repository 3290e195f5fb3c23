//! How fast does the transformer learn chain-sum from demonstrations? (experiment aid)
//! `cargo run --release -p areal-model --example sft_probe -- hidden layers lr batch steps error max_terms`

use std::time::Instant;

use areal_model::{TransformerOptions, TransformerPolicy};
use areal_sdk::{Split, Task, Tokenizer};
use areal_sdk_train::burn::optim::AdamWConfig;
use areal_sdk_train::burn::tensor::{Device, Tensor, TensorData};
use areal_sdk_train::{PackedBatch, Policy};
use areal_tasks::chain_sum::{ALPHABET, ChainSum, ChainSumOptions};

static MODULO: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn examples(
    task: &ChainSum,
    tok: &dyn Tokenizer,
    split: Split,
    range: std::ops::Range<u64>,
) -> Vec<(Vec<u32>, Vec<u32>)> {
    range
        .map(|i| {
            let item = task.item(split, i).unwrap();
            let mut demo = task.demonstration(&item).unwrap().unwrap();
            let m = MODULO.load(std::sync::atomic::Ordering::Relaxed);
            if m > 0 {
                let terms: Vec<u32> = item.reference["terms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect();
                let mut total = 0;
                let steps: Vec<String> = terms
                    .iter()
                    .enumerate()
                    .map(|(k, t)| {
                        total = (total + t) % m;
                        format!("{}{t}={total}", (b'a' + k as u8) as char)
                    })
                    .collect();
                demo = format!("{}>{total}", steps.join(","));
            }
            let mut c = tok.encode(&demo).unwrap();
            c.push(1);
            (tok.encode(&item.prompt).unwrap(), c)
        })
        .collect()
}

#[allow(clippy::print_stdout)]
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: f64| a.get(i).map_or(d, |s| s.parse().unwrap());
    let (hidden, layers, lr, batch, steps, error, max_terms) = (
        num(0, 128.0) as usize,
        num(1, 4.0) as usize,
        num(2, 3e-3),
        num(3, 32.0) as usize,
        num(4, 400.0) as u64,
        num(5, 0.0),
        num(6, 12.0) as usize,
    );
    MODULO.store(num(7, 0.0) as u32, std::sync::atomic::Ordering::Relaxed);
    let device = Device::flex().autodiff();
    let options = TransformerOptions {
        hidden_size: hidden,
        layers,
        heads: 4,
        kv_heads: 2,
        max_positions: 128,
        ..TransformerOptions::default()
    };
    let mut policy = TransformerPolicy::fresh(&options, ALPHABET, 1, &device).unwrap();
    let task = ChainSum::new(
        ChainSumOptions {
            demo_carry_error: error,
            max_terms,
            ..ChainSumOptions::default()
        },
        1,
    );
    let tok = policy.tokenizer();
    let mut optimizer = AdamWConfig::new().init();
    let val = examples(&task, tok.as_ref(), Split::Validation, 0..100);
    let start = Instant::now();
    let mut tokens = 0;
    for step in 1..=steps {
        let ex = examples(
            &task,
            tok.as_ref(),
            Split::Train,
            step * batch as u64..(step + 1) * batch as u64,
        );
        let mut b = PackedBatch::new(1.0);
        let mut mask = Vec::new();
        for (p, c) in &ex {
            let mut s = p.clone();
            s.extend(c);
            b.push(&s);
            mask.extend(std::iter::repeat_n(0.0f32, p.len()));
            mask.extend(std::iter::repeat_n(1.0f32, c.len()));
        }
        let n: f32 = mask.iter().sum();
        tokens += b.num_tokens();
        let m = Tensor::<1>::from_data(TensorData::new(mask.clone(), [mask.len()]), &device);
        let loss = (policy.logprobs(&b).unwrap() * m).sum().neg().div_scalar(n);
        let lv = loss.clone().into_scalar::<f32>();
        policy.backward(loss).unwrap();
        policy.step(&mut optimizer, lr, Some(1.0)).unwrap();
        if step % 50 == 0 {
            // teacher-forced: fraction of demonstration tokens that are the argmax, and of
            // sequences whose every token is
            let model = areal_sdk_train::burn::module::Module::valid(policy.model());
            let (mut right, mut total, mut whole) = (0, 0, 0);
            let mut kinds = [[0usize; 2]; 3];
            for (p, c) in &val {
                let mut s = p.clone();
                s.extend(c);
                let ids: Vec<i64> = s.iter().map(|&x| i64::from(x)).collect();
                let t = ids.len();
                let logits = model.forward(Tensor::from_data(
                    TensorData::new(ids, [1, t]),
                    &Device::flex(),
                ));
                let arg: Vec<i64> = logits
                    .argmax(2)
                    .into_data()
                    .convert::<i64>()
                    .try_to_vec()
                    .unwrap();
                let mut all = true;
                let text: Vec<char> = tok.decode(&c[..c.len() - 1]).unwrap().chars().collect();
                let mut after_eq = false;
                for j in 0..c.len() {
                    let ok = arg[p.len() - 1 + j] == i64::from(c[j]);
                    let prev = if j == 0 { '=' } else { text[j - 1] };
                    if prev == '=' || prev == '>' {
                        after_eq = true;
                    }
                    if prev == ',' {
                        after_eq = false;
                    }
                    let kind = if prev.is_ascii_lowercase() {
                        0
                    } else if after_eq && j < text.len() && text[j].is_ascii_digit() {
                        1
                    } else {
                        2
                    };
                    kinds[kind][0] += usize::from(ok);
                    kinds[kind][1] += 1;
                    right += usize::from(ok);
                    all &= ok;
                }
                total += c.len();
                whole += usize::from(all);
            }
            println!(
                "step {step} ({:.0} s, {:.0} tok/s): loss {lv:.3}, token acc {:.3}, sequence acc {:.2}, copy {:.2}, sum {:.2}, other {:.2}",
                start.elapsed().as_secs_f64(),
                tokens as f64 / start.elapsed().as_secs_f64(),
                right as f64 / total as f64,
                whole as f64 / val.len() as f64,
                kinds[0][0] as f64 / kinds[0][1].max(1) as f64,
                kinds[1][0] as f64 / kinds[1][1].max(1) as f64,
                kinds[2][0] as f64 / kinds[2][1].max(1) as f64,
            );
        }
    }
}
