//! Prints the step schedule of a model on a hardware config.
//! `cargo run -p faultline-graph --example schedule -- models/mlp-digits.ron configs/tpu-32x32.ron [batch]`

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).map_or("models/mlp-digits.ron", String::as_str);
    let hw = args.get(2).map_or("configs/tpu-32x32.ron", String::as_str);
    let batch = args.get(3).map_or(Ok(32), |b| b.parse())?;
    let spec = faultline_graph::ModelSpec::load(model)?;
    let tg = faultline_graph::TrainGraph::build(&spec, batch, faultline_graph::OptimizerSpec::Sgd { lr: 0.1 })?;
    let cfg = faultline_hw::HwConfig::load(hw)?;
    let s = faultline_graph::lower::schedule(&tg, &cfg);
    println!("{} (batch {batch}, {} params, {} nodes)", tg.model, tg.param_count(), tg.graph.len());
    println!("{s}");
    if args.iter().any(|a| a == "--csv") {
        print!("{}", s.to_csv());
    }
    Ok(())
}
