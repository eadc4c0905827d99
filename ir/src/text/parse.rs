//! The parser: canonical (or hand-written) text to [`StepIr`].
//!
//! Descent over the lexer's tokens, one statement per line, to a fixed depth (statements hold
//! attributes, attributes hold values, a list holds scalars): no input can grow the stack. Every error carries the
//! line and column of the token that broke the grammar. The parser builds the graph; it does not
//! judge it: invariants are the verifier's job, so an IR that parses but is wrong is reported by
//! [`crate::verify`] with the node's name.

use std::collections::HashMap;
use std::str::FromStr;

use super::lexer::{lex, Spanned, Token};
use crate::error::{IrError, Result};
use crate::spec::{ClusterSpec, GpuSpec, LinkSpec, ModelSpec, ParallelSpec, Spec};
mod schedule;

use crate::step::{
    BatchInfo, Direction, Pack, PackId, Phase, ReplicaId, Sample, SampleId, Slice, SliceId, Stage,
    StepIr,
};

/// Parses IR text; `source_name` names the input in errors.
pub fn parse(text: &str, source_name: &str) -> Result<StepIr> {
    let tokens = lex(text, source_name)?;
    let mut parser = Parser {
        tokens,
        pos: 0,
        source_name,
        text,
        workers: None,
    };
    parser.step()
}

/// An attribute value.
#[derive(Debug, Clone)]
enum Value {
    Word(String),
    Str(String),
    Name(String),
    Range(String, String),
    List(Vec<(Value, Pos)>),
}

type Pos = (usize, usize);

/// Attributes of one statement, by key, with positions (in order of appearance).
struct Attributes {
    statement: &'static str,
    at: Pos,
    entries: Vec<(String, Value, Pos)>,
}

/// What a `%name` refers to.
#[derive(Debug, Clone, Copy)]
enum Named {
    Stage(u32),
    Replica(ReplicaId),
    Sample,
    Slice(SliceId),
    Pack(PackId),
}

struct Parser<'a> {
    tokens: Vec<Spanned>,
    pos: usize,
    source_name: &'a str,
    text: &'a str,
    /// Lines (1-based, inclusive) spanned by the `worker` blocks of a lowered step.
    workers: Option<(usize, usize)>,
}

impl Parser<'_> {
    // ---- token plumbing ----

    fn peek(&self) -> &Token {
        &self.tokens[self.pos].token
    }

    fn here(&self) -> Pos {
        let t = &self.tokens[self.pos];
        (t.line, t.column)
    }

    fn next(&mut self) -> Spanned {
        let token = self.tokens[self.pos].clone();
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        token
    }

    fn error_at(&self, (line, column): Pos, message: impl Into<String>) -> IrError {
        IrError::Parse {
            source_name: self.source_name.to_string(),
            line,
            column,
            message: message.into(),
        }
    }

    fn unexpected(&self, expected: &str) -> IrError {
        self.error_at(
            self.here(),
            format!("expected {expected}, found {}", self.peek().describe()),
        )
    }

    fn expect(&mut self, token: Token, expected: &str) -> Result<()> {
        if *self.peek() == token {
            self.next();
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    fn expect_word(&mut self, expected: &str) -> Result<(String, Pos)> {
        let at = self.here();
        match self.peek().clone() {
            Token::Word(word) => {
                self.next();
                Ok((word, at))
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    fn expect_keyword(&mut self, keyword: &str) -> Result<()> {
        match self.peek() {
            Token::Word(word) if word == keyword => {
                self.next();
                Ok(())
            }
            _ => Err(self.unexpected(&format!("'{keyword}'"))),
        }
    }

    fn expect_name(&mut self, expected: &str) -> Result<(String, Pos)> {
        let at = self.here();
        match self.peek().clone() {
            Token::Name(name) => {
                self.next();
                Ok((name, at))
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    fn skip_newlines(&mut self) {
        while *self.peek() == Token::Newline {
            self.next();
        }
    }

    fn end_of_statement(&mut self) -> Result<()> {
        match self.peek() {
            Token::Newline => {
                self.next();
                Ok(())
            }
            Token::RBrace | Token::Eof => Ok(()),
            _ => Err(self.unexpected("end of line")),
        }
    }

    // ---- values and attributes ----

    /// A value: a scalar, or a list of scalars. Lists do not nest, so the parser's depth
    /// never depends on the input (a million `[` is one error, not a stack overflow).
    fn value(&mut self) -> Result<(Value, Pos)> {
        if *self.peek() != Token::LBracket {
            return self.scalar();
        }
        let at = self.here();
        self.next();
        let mut items = Vec::new();
        if *self.peek() != Token::RBracket {
            loop {
                if *self.peek() == Token::LBracket {
                    return Err(self.error_at(self.here(), "lists do not nest: expected a value"));
                }
                items.push(self.scalar()?);
                if *self.peek() == Token::Comma {
                    self.next();
                } else {
                    break;
                }
            }
        }
        self.expect(Token::RBracket, "',' or ']'")?;
        Ok((Value::List(items), at))
    }

    /// A word, range, string or name.
    fn scalar(&mut self) -> Result<(Value, Pos)> {
        let at = self.here();
        let value = match self.next().token {
            Token::Word(word) => {
                if *self.peek() == Token::DotDot {
                    self.next();
                    let (end, _) = self.expect_word("the end of a range")?;
                    Value::Range(word, end)
                } else {
                    Value::Word(word)
                }
            }
            Token::Str(text) => Value::Str(text),
            Token::Name(name) => Value::Name(name),
            other => {
                return Err(
                    self.error_at(at, format!("expected a value, found {}", other.describe()))
                )
            }
        };
        Ok((value, at))
    }

    /// `key=value` pairs up to the end of the statement.
    fn attributes(&mut self, statement: &'static str, at: Pos) -> Result<Attributes> {
        let mut entries: Vec<(String, Value, Pos)> = Vec::new();
        while let Token::Word(_) = self.peek() {
            let (key, key_at) = self.expect_word("an attribute")?;
            if entries.iter().any(|(k, _, _)| *k == key) {
                return Err(self.error_at(key_at, format!("duplicate attribute '{key}'")));
            }
            // `on %r0` places a node; every other attribute is `key=value`.
            let placement = key == "on" && matches!(self.peek(), Token::Name(_));
            if !placement {
                self.expect(Token::Equals, &format!("'=' after '{key}'"))?;
            }
            let (value, _) = self.value()?;
            entries.push((key, value, key_at));
        }
        self.end_of_statement()?;
        Ok(Attributes {
            statement,
            at,
            entries,
        })
    }

    fn take(&self, attrs: &mut Attributes, key: &str) -> Result<(Value, Pos)> {
        self.take_optional(attrs, key)?.ok_or_else(|| {
            self.error_at(
                attrs.at,
                format!("{} is missing attribute '{key}'", attrs.statement),
            )
        })
    }

    fn take_optional(&self, attrs: &mut Attributes, key: &str) -> Result<Option<(Value, Pos)>> {
        Ok(attrs
            .entries
            .iter()
            .position(|(k, _, _)| k == key)
            .map(|i| {
                let (_, value, at) = attrs.entries.remove(i);
                (value, at)
            }))
    }

    fn finish(&self, attrs: Attributes, valid: &[&str]) -> Result<()> {
        match attrs.entries.first() {
            None => Ok(()),
            Some((key, _, at)) => Err(self.error_at(
                *at,
                format!(
                    "unknown attribute '{key}' of {} (valid: {})",
                    attrs.statement,
                    valid.join(", ")
                ),
            )),
        }
    }

    fn number<T: FromStr>(&self, (value, at): (Value, Pos), what: &str) -> Result<T> {
        match value {
            Value::Word(word) => word
                .parse()
                .map_err(|_| self.error_at(at, format!("'{word}' is not a valid {what}"))),
            _ => Err(self.error_at(at, format!("expected {what}"))),
        }
    }

    fn word<T: FromStr<Err = String>>(&self, (value, at): (Value, Pos)) -> Result<T> {
        match value {
            Value::Word(word) => word.parse().map_err(|e: String| self.error_at(at, e)),
            _ => Err(self.error_at(at, "expected a word")),
        }
    }

    fn string(&self, (value, at): (Value, Pos)) -> Result<String> {
        match value {
            Value::Str(text) => Ok(text),
            _ => Err(self.error_at(at, "expected a quoted string")),
        }
    }

    fn range(&self, (value, at): (Value, Pos)) -> Result<(u32, u32)> {
        match value {
            Value::Range(start, end) => {
                let parse = |text: &str| {
                    text.parse::<u32>()
                        .map_err(|_| self.error_at(at, format!("'{text}' is not a valid offset")))
                };
                Ok((parse(&start)?, parse(&end)?))
            }
            _ => Err(self.error_at(at, "expected a range A..B")),
        }
    }

    fn bool(&self, (value, at): (Value, Pos)) -> Result<bool> {
        match value {
            Value::Word(word) if word == "true" => Ok(true),
            Value::Word(word) if word == "false" => Ok(false),
            _ => Err(self.error_at(at, "expected true or false")),
        }
    }

    // ---- the step ----

    fn step(&mut self) -> Result<StepIr> {
        self.skip_newlines();
        self.expect_keyword("step")?;
        self.expect_keyword("phase")?;
        self.expect(Token::Equals, "'=' after 'phase'")?;
        let (phase_word, phase_at) = self.expect_word("a phase")?;
        let phase: Phase = phase_word
            .parse()
            .map_err(|e: String| self.error_at(phase_at, e))?;
        self.expect(Token::LBrace, "'{'")?;
        self.end_of_statement()?;

        let (spec, batch) = self.header()?;
        let mut body = Body {
            ir: None,
            spec: Some((spec, batch)),
            stages: Vec::new(),
            names: HashMap::new(),
            last_sample: None,
            rank_orders: Default::default(),
            pack_recompute: Default::default(),
        };
        loop {
            self.skip_newlines();
            match self.peek().clone() {
                Token::RBrace => {
                    self.next();
                    break;
                }
                Token::Name(_) => self.definition(&mut body)?,
                Token::Word(word) if word == "schedule" => self.schedule(&mut body)?,
                Token::Word(word) if word == "interleave" => self.interleave(&mut body)?,
                Token::Word(word) if word == "order" => self.rank_order(&mut body)?,
                Token::Word(word) if word == "recompute" => self.pack_recompute(&mut body)?,
                Token::Word(word) if word == "worker" => self.worker_block()?,
                _ => {
                    return Err(self.unexpected(
                        "a '%name = ...' definition, 'schedule', 'interleave', 'recompute', \
                         'order', 'worker' or '}'",
                    ))
                }
            }
        }
        self.skip_newlines();
        if *self.peek() != Token::Eof {
            return Err(self.unexpected("end of input after '}'"));
        }
        body.ir_mut();
        let mut ir = body.ir.take().expect("ir_mut creates the IR (bug)");
        // After every schedule, which would clear them (a file may list them anywhere).
        for ((pack, stage), mode) in std::mem::take(&mut body.pack_recompute) {
            if stage < ir.stages().len() as u32 {
                ir.set_pack_recompute(pack, stage, Some(mode));
            }
        }
        for ((rank, device), order) in std::mem::take(&mut body.rank_orders) {
            ir.set_rank_order(rank, device, &order);
        }
        // An empty batch, which `compile` refuses, is no step in the text form either.
        if ir.samples().is_empty() {
            return Err(self.error_at(phase_at, "the step holds no sample"));
        }
        ir.advance(phase);
        self.lower_workers(&mut ir)?;
        Ok(ir)
    }

    /// Skips a `worker dp=.. pp=.. { ... }` block, remembering its lines; they are checked
    /// against the lowering of the whole step once it is read ([`Parser::check_workers`]).
    fn worker_block(&mut self) -> Result<()> {
        let (first, _) = self.here();
        let last = loop {
            if *self.peek() == Token::Eof {
                return Err(self.unexpected("'}' closing the worker block"));
            }
            let token = self.next();
            if token.token == Token::RBrace {
                break token.line;
            }
        };
        self.workers = Some(match self.workers {
            Some((start, _)) => (start, last),
            None => (first, last),
        });
        Ok(())
    }

    /// A lowered step carries its program, derived from its schedule: the parser stores it,
    /// and the text's worker blocks (if any) must hold exactly what the schedule lowers to.
    fn lower_workers(&self, ir: &mut StepIr) -> Result<()> {
        if ir.phase() < Phase::Lowered {
            return match self.workers {
                None => Ok(()),
                Some((first, _)) => Err(self.error_at(
                    (first, 1),
                    format!(
                        "worker blocks belong to a lowered step, this one is {}",
                        ir.phase()
                    ),
                )),
            };
        }
        let sound = crate::verify::check(ir)
            .iter()
            .all(|e| e.invariant == crate::verify::PROGRAM_STORED);
        if !sound {
            // A broken step has no lowering; the verifier names what is broken.
            return Ok(());
        }
        // An op list that cannot run stays stored for the verifier to name.
        let _ = crate::program::lower_into(ir);
        let Some((first, last)) = self.workers else {
            return Ok(());
        };
        let mut expected = String::new();
        crate::program::print_workers(ir.program().expect("just stored"), &mut expected);
        let given = self.text.lines().skip(first - 1).take(last - first + 1);
        let mut expected_lines = expected.lines();
        for (offset, line) in given.enumerate() {
            let want = expected_lines.next();
            if want.map(str::trim_end) != Some(line.trim_end()) {
                return Err(self.error_at(
                    (first + offset, 1),
                    format!(
                        "worker op lists are derived from the schedule; expected `{}` here",
                        want.map_or("(end of the worker blocks)", str::trim)
                    ),
                ));
            }
        }
        if let Some(missing) = expected_lines.next() {
            return Err(self.error_at(
                (last, 1),
                format!(
                    "worker blocks end early; expected `{}` next",
                    missing.trim()
                ),
            ));
        }
        Ok(())
    }

    fn header(&mut self) -> Result<(Spec, BatchInfo)> {
        let mut sections: HashMap<&'static str, Attributes> = HashMap::new();
        let start = self.here();
        loop {
            self.skip_newlines();
            let at = self.here();
            let statement = match self.peek() {
                Token::Word(word) => match word.as_str() {
                    "model" => "model",
                    "gpu" => "gpu",
                    "cluster" => "cluster",
                    "parallel" => "parallel",
                    "batch" => "batch",
                    _ => break,
                },
                _ => break,
            };
            if sections.contains_key(statement) {
                return Err(self.error_at(at, format!("duplicate '{statement}' statement")));
            }
            self.next();
            let attrs = self.attributes(statement, at)?;
            sections.insert(statement, attrs);
        }
        let mut section = |name: &'static str| {
            sections.remove(name).ok_or_else(|| {
                self.error_at(start, format!("missing '{name}' statement before the body"))
            })
        };
        let (model, gpu, cluster, parallel, batch) = (
            section("model")?,
            section("gpu")?,
            section("cluster")?,
            section("parallel")?,
            section("batch")?,
        );
        let model_at = model.at;
        let spec = Spec {
            model: self.model(model)?,
            cluster: self.cluster(gpu, cluster)?,
            parallel: self.parallel(parallel)?,
        };
        spec.validate()
            .map_err(|e| self.error_at(model_at, e.to_string()))?;
        Ok((spec, self.batch(batch)?))
    }

    fn model(&self, mut a: Attributes) -> Result<ModelSpec> {
        let model = ModelSpec {
            name: self.string(self.take(&mut a, "name")?)?,
            layers: self.number(self.take(&mut a, "layers")?, "layer count")?,
            hidden: self.number(self.take(&mut a, "hidden")?, "hidden size")?,
            heads: self.number(self.take(&mut a, "heads")?, "head count")?,
            kv_heads: self.number(self.take(&mut a, "kv_heads")?, "K/V head count")?,
            head_dim: self.number(self.take(&mut a, "head_dim")?, "head dimension")?,
            ffn: self.number(self.take(&mut a, "ffn")?, "ffn size")?,
            vocab: self.number(self.take(&mut a, "vocab")?, "vocabulary size")?,
            dtype: self.word(self.take(&mut a, "dtype")?)?,
            recompute: self.word(self.take(&mut a, "recompute")?)?,
            tied_embeddings: self.bool(self.take(&mut a, "tied_embeddings")?)?,
        };
        self.finish(
            a,
            &[
                "name",
                "layers",
                "hidden",
                "heads",
                "kv_heads",
                "head_dim",
                "ffn",
                "vocab",
                "dtype",
                "recompute",
                "tied_embeddings",
            ],
        )?;
        Ok(model)
    }

    fn cluster(&self, mut g: Attributes, mut c: Attributes) -> Result<ClusterSpec> {
        let gpu = GpuSpec {
            name: self.string(self.take(&mut g, "name")?)?,
            peak_flops: self.number(self.take(&mut g, "peak_flops")?, "FLOP/s figure")?,
            hbm_bytes: self.number(self.take(&mut g, "hbm_bytes")?, "byte count")?,
            hbm_bandwidth: self.number(self.take(&mut g, "hbm_bandwidth")?, "bandwidth")?,
        };
        self.finish(g, &["name", "peak_flops", "hbm_bytes", "hbm_bandwidth"])?;
        let cluster = ClusterSpec {
            name: self.string(self.take(&mut c, "name")?)?,
            gpu,
            gpus_per_node: self.number(self.take(&mut c, "gpus_per_node")?, "device count")?,
            intra_node: LinkSpec {
                bandwidth: self.number(self.take(&mut c, "intra_bandwidth")?, "bandwidth")?,
                latency: self.number(self.take(&mut c, "intra_latency")?, "latency")?,
            },
            inter_node: LinkSpec {
                bandwidth: self.number(self.take(&mut c, "inter_bandwidth")?, "bandwidth")?,
                latency: self.number(self.take(&mut c, "inter_latency")?, "latency")?,
            },
        };
        self.finish(
            c,
            &[
                "name",
                "gpus_per_node",
                "intra_bandwidth",
                "intra_latency",
                "inter_bandwidth",
                "inter_latency",
            ],
        )?;
        Ok(cluster)
    }

    fn parallel(&self, mut a: Attributes) -> Result<ParallelSpec> {
        let parallel = ParallelSpec {
            tp: self.number(self.take(&mut a, "tp")?, "degree")?,
            cp: self
                .take_optional(&mut a, "cp")?
                .map(|v| self.number(v, "degree"))
                .transpose()?,
            pp: self.number(self.take(&mut a, "pp")?, "degree")?,
            vpp: self
                .take_optional(&mut a, "vpp")?
                .map(|v| self.number(v, "degree"))
                .transpose()?
                .unwrap_or(1),
            dp: self.number(self.take(&mut a, "dp")?, "degree")?,
        };
        self.finish(a, &["tp", "cp", "pp", "vpp", "dp"])?;
        Ok(parallel)
    }

    fn batch(&self, mut a: Attributes) -> Result<BatchInfo> {
        let batch = BatchInfo {
            source: self.string(self.take(&mut a, "source")?)?,
            context: self
                .take_optional(&mut a, "context")?
                .map(|v| self.number(v, "context length"))
                .transpose()?,
            documents: self.number(self.take(&mut a, "documents")?, "document count")?,
            documents_cut: self.number(self.take(&mut a, "documents_cut")?, "document count")?,
        };
        self.finish(a, &["source", "context", "documents", "documents_cut"])?;
        Ok(batch)
    }

    // ---- body ----

    fn definition(&mut self, body: &mut Body) -> Result<()> {
        let (name, name_at) = self.expect_name("a '%name'")?;
        if body.names.contains_key(&name) {
            return Err(self.error_at(name_at, format!("'%{name}' is defined twice")));
        }
        self.expect(Token::Equals, &format!("'=' after '%{name}'"))?;
        let (kind, kind_at) = self.expect_word("stage, replica, sample, slice or pack")?;
        let named = match kind.as_str() {
            "stage" => {
                if body.ir.is_some() {
                    return Err(self.error_at(
                        kind_at,
                        "stages must be defined before replicas, samples and packs",
                    ));
                }
                let mut a = self.attributes("stage", kind_at)?;
                let (first, end) = self.range(self.take(&mut a, "layers")?)?;
                let recompute = match self.take_optional(&mut a, "recompute")? {
                    Some(value) => Some(self.word(value)?),
                    None => None,
                };
                self.finish(a, &["layers", "recompute"])?;
                let index = body.stages.len() as u32;
                body.stages.push(Stage {
                    index,
                    first_layer: first,
                    layers: end.saturating_sub(first),
                    recompute,
                });
                Named::Stage(index)
            }
            "replica" => {
                let mut a = self.attributes("replica", kind_at)?;
                let (value, at) = self.take(&mut a, "dp")?;
                let Value::List(items) = value else {
                    return Err(self.error_at(at, "expected a list of DP ranks [i, j, ...]"));
                };
                let ranks = items
                    .into_iter()
                    .map(|item| self.number(item, "DP rank"))
                    .collect::<Result<Vec<u32>>>()?;
                self.finish(a, &["dp"])?;
                Named::Replica(body.ir_mut().add_replica(ranks))
            }
            "sample" => {
                let mut a = self.attributes("sample", kind_at)?;
                let sample = Sample {
                    len: self.number(self.take(&mut a, "len")?, "sample length")?,
                    doc: self.number(self.take(&mut a, "doc")?, "document index")?,
                    piece: self.number(self.take(&mut a, "piece")?, "piece index")?,
                };
                let replica = match self.take_optional(&mut a, "on")? {
                    Some(value) => Some(self.replica_ref(body, value)?),
                    None => None,
                };
                self.finish(a, &["len", "doc", "piece", "on"])?;
                let ir = body.ir_mut();
                let id = ir.add_bare_sample(sample);
                if let Some(replica) = replica {
                    ir.place_sample(id, replica);
                }
                body.last_sample = Some(id);
                Named::Sample
            }
            "slice" => {
                let at = self.here();
                let (value, range_at) = self.value()?;
                let (start, end) = self.range((value, range_at))?;
                if end <= start {
                    return Err(self.error_at(
                        range_at,
                        format!("empty slice {start}..{end} (the end must be after the start)"),
                    ));
                }
                self.end_of_statement()?;
                let sample = body.last_sample.ok_or_else(|| {
                    self.error_at(at, "a slice must follow the sample it belongs to")
                })?;
                let id = body.ir_mut().add_slice(
                    sample,
                    Slice {
                        start,
                        len: end - start,
                    },
                );
                Named::Slice(id)
            }
            "pack" => self.pack(body)?,
            other => {
                return Err(self.error_at(
                    kind_at,
                    format!(
                        "unknown definition '{other}' (valid: stage, replica, sample, slice, pack)"
                    ),
                ))
            }
        };
        body.names.insert(name, named);
        Ok(())
    }

    fn pack(&mut self, body: &mut Body) -> Result<Named> {
        let (direction_word, direction_at) = self.expect_word("fwd or bwd")?;
        let direction = match direction_word.as_str() {
            "fwd" => Direction::Forward,
            "bwd" => Direction::Backward,
            other => {
                return Err(self.error_at(
                    direction_at,
                    format!("unknown pack direction '{other}' (valid: fwd, bwd)"),
                ))
            }
        };
        self.expect_keyword("on")?;
        let (replica_name, replica_at) = self.expect_name("a replica '%name'")?;
        let replica = self.replica_ref(body, (Value::Name(replica_name), replica_at))?;
        let mut cap = None;
        if let Token::Word(word) = self.peek() {
            if word == "cap" {
                self.next();
                self.expect(Token::Equals, "'=' after 'cap'")?;
                let value = self.value()?;
                cap = Some(self.number(value, "token cap")?);
            }
        }
        let mut padded = None;
        if let Token::Word(word) = self.peek() {
            if word == "pad" {
                self.next();
                self.expect(Token::Equals, "'=' after 'pad'")?;
                let value = self.value()?;
                padded = Some(self.number(value, "padded length")?);
            }
        }
        let (members, members_at) = self.value()?;
        let Value::List(items) = members else {
            return Err(self.error_at(members_at, "expected the pack's slices [%a, %b, ...]"));
        };
        let mut slices = Vec::with_capacity(items.len());
        for (item, at) in items {
            match item {
                Value::Name(name) => match body.names.get(&name) {
                    Some(Named::Slice(slice)) => slices.push(*slice),
                    Some(_) => return Err(self.error_at(at, format!("'%{name}' is not a slice"))),
                    None => return Err(self.error_at(at, format!("undefined name '%{name}'"))),
                },
                _ => return Err(self.error_at(at, "expected a slice '%name'")),
            }
        }
        self.end_of_statement()?;
        let ir = body.ir_mut();
        let pack = ir.add_pack(Pack { direction, cap }, replica, &slices);
        if let Some(padded) = padded {
            ir.set_padding(pack, padded);
        }
        Ok(Named::Pack(pack))
    }
}

/// Parser state of the body: the IR is created when the first non-stage statement arrives.
struct Body {
    ir: Option<StepIr>,
    spec: Option<(Spec, BatchInfo)>,
    stages: Vec<Stage>,
    names: HashMap<String, Named>,
    last_sample: Option<SampleId>,
    /// Shared ranks' orders, set once every schedule is read.
    rank_orders: std::collections::BTreeMap<(u32, u32), Vec<ReplicaId>>,
    /// Forward packs' own recomputation by (pack, stage index), set after the schedules too.
    pack_recompute: std::collections::BTreeMap<(PackId, u32), crate::spec::Recompute>,
}

impl Body {
    fn ir_mut(&mut self) -> &mut StepIr {
        if self.ir.is_none() {
            let (spec, batch) = self
                .spec
                .take()
                .expect("the header is parsed before the body (bug)");
            self.ir = Some(StepIr::with_stages(spec, batch, &self.stages));
        }
        self.ir.as_mut().expect("just created")
    }
}
