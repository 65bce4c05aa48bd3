use clap::Args; #[derive(Args)] pub struct GemmArgs {} pub fn run(_a: GemmArgs) -> anyhow::Result<()> { Ok(()) }
