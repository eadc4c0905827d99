//! The schedule section of the text form: `schedule`, `interleave`, `recompute` and `order`
//! statements, which refer to the replicas, stages and packs defined before them.

use super::{Body, Named, Parser, Pos, Token, Value};
use crate::error::Result;
use crate::spec::Recompute;
use crate::step::{Direction, Part, ReplicaId, StageOp};

impl Parser<'_> {
    pub(super) fn schedule(&mut self, body: &mut Body) -> Result<()> {
        self.next();
        let (replica_name, replica_at) = self.expect_name("a replica '%name'")?;
        let replica = self.replica_ref(body, (Value::Name(replica_name), replica_at))?;
        let (_, stage) = self.stage_ref(body)?;
        let (order, order_at) = self.value()?;
        let Value::List(items) = order else {
            return Err(self.error_at(order_at, "expected the schedule's packs [%f0, %b0, ...]"));
        };
        let mut ops = Vec::with_capacity(items.len());
        for (item, at) in items {
            let Value::Name(name) = item else {
                return Err(self.error_at(at, "expected a pack '%name'"));
            };
            // `%b0.dx` / `%b0.dw`: the input- or weight-gradient part of a split backward.
            let (base, part) = match name.rsplit_once('.') {
                Some((base, "dx")) => (base, Part::InputGrad),
                Some((base, "dw")) => (base, Part::WeightGrad),
                _ => (name.as_str(), Part::Whole),
            };
            match body.names.get(base) {
                Some(Named::Pack(pack)) => ops.push(StageOp { pack: *pack, part }),
                Some(_) => return Err(self.error_at(at, format!("'%{base}' is not a pack"))),
                None => return Err(self.error_at(at, format!("undefined name '%{base}'"))),
            }
        }
        if ops.iter().filter(|op| op.part != Part::WeightGrad).count() < 2 {
            return Err(self.error_at(
                order_at,
                "a schedule lists at least two packs (a forward and a backward)",
            ));
        }
        self.end_of_statement()?;
        let ir = body.ir_mut();
        ir.set_stage_ops(replica, stage, &ops);
        // The text names each chain op's part; the IR derives it from the deferred weight
        // gradients, so the two must agree.
        if ir.stage_ops(replica, stage) != ops {
            return Err(self.error_at(
                order_at,
                "a split backward lists its input gradient `%bN.dx` in the order and its weight \
                 gradient `%bN.dw` once, later; an unsplit backward is plain `%bN`",
            ));
        }
        Ok(())
    }

    /// `interleave %r0 pp=1 [0, 0, 1, ...]`: the chunk of each pack pipeline device `pp` runs.
    pub(super) fn interleave(&mut self, body: &mut Body) -> Result<()> {
        self.next();
        let (replica_name, replica_at) = self.expect_name("a replica '%name'")?;
        let replica = self.replica_ref(body, (Value::Name(replica_name), replica_at))?;
        self.expect_keyword("pp")?;
        self.expect(Token::Equals, "'=' after 'pp'")?;
        let value = self.value()?;
        let device: u32 = self.number(value, "pipeline device")?;
        let (order, order_at) = self.value()?;
        let Value::List(items) = order else {
            return Err(self.error_at(order_at, "expected the device's chunks [0, 1, ...]"));
        };
        let mut chunks = Vec::with_capacity(items.len());
        for item in items {
            chunks.push(self.number(item, "model chunk")?);
        }
        self.end_of_statement()?;
        let ir = body.ir_mut();
        if ir.spec.parallel.vpp == 1 || device >= ir.spec.parallel.pp {
            return Err(self.error_at(
                order_at,
                format!(
                    "an interleave needs model chunks (vpp > 1) and a device below pp; the layout is {}",
                    ir.spec.parallel
                ),
            ));
        }
        ir.set_interleave(replica, device, &chunks);
        Ok(())
    }

    /// `recompute %st0 block:2 [%f0, %f3]`: forward packs that save their activations on the
    /// stage under that mode instead of the stage's.
    pub(super) fn pack_recompute(&mut self, body: &mut Body) -> Result<()> {
        self.next();
        let (stage_name, stage) = self.stage_ref(body)?;
        let mode = self.value()?;
        let mode: Recompute = self.word(mode)?;
        let (packs, packs_at) = self.value()?;
        let Value::List(items) = packs else {
            return Err(self.error_at(packs_at, "expected the forward packs [%f0, %f3, ...]"));
        };
        for (item, at) in items {
            let Value::Name(name) = item else {
                return Err(self.error_at(at, "expected a forward pack '%name'"));
            };
            let pack = match body.names.get(&name) {
                Some(Named::Pack(pack)) => *pack,
                Some(_) => return Err(self.error_at(at, format!("'%{name}' is not a pack"))),
                None => return Err(self.error_at(at, format!("undefined name '%{name}'"))),
            };
            if body.ir_mut().pack(pack).direction != Direction::Forward {
                return Err(self.error_at(
                    at,
                    format!("'%{name}' is a backward pack: a forward pack names what it saves"),
                ));
            }
            if body.pack_recompute.insert((pack, stage), mode).is_some() {
                return Err(self.error_at(
                    at,
                    format!("a second recompute for '%{name}' on '%{stage_name}'"),
                ));
            }
        }
        self.end_of_statement()
    }

    /// `order dp=3 pp=0 [%r3, %r16, %r16, %r3, ...]`: the replica of each op DP rank `dp`'s
    /// pipeline device `pp` runs, where the rank is in several replicas.
    pub(super) fn rank_order(&mut self, body: &mut Body) -> Result<()> {
        self.next();
        let mut key = [0u32; 2];
        for (slot, (keyword, what)) in [("dp", "DP rank"), ("pp", "pipeline device")]
            .into_iter()
            .enumerate()
        {
            self.expect_keyword(keyword)?;
            self.expect(Token::Equals, &format!("'=' after '{keyword}'"))?;
            let value = self.value()?;
            key[slot] = self.number(value, what)?;
        }
        let (order, order_at) = self.value()?;
        let Value::List(items) = order else {
            return Err(self.error_at(order_at, "expected the replica of each op [%r0, %r4, ...]"));
        };
        let mut replicas = Vec::with_capacity(items.len());
        for item in items {
            replicas.push(self.replica_ref(body, item)?);
        }
        self.end_of_statement()?;
        let parallel = body.ir_mut().spec.parallel;
        if key[0] >= parallel.dp || key[1] >= parallel.pp {
            return Err(self.error_at(
                order_at,
                format!(
                    "dp={} pp={} is no DP rank and pipeline device of the layout {parallel}",
                    key[0], key[1]
                ),
            ));
        }
        if body
            .rank_orders
            .insert((key[0], key[1]), replicas)
            .is_some()
        {
            return Err(self.error_at(
                order_at,
                format!("a second order for dp={} pp={}", key[0], key[1]),
            ));
        }
        Ok(())
    }

    /// The next token, a stage's name: the name and the stage's index.
    fn stage_ref(&mut self, body: &Body) -> Result<(String, u32)> {
        let (name, at) = self.expect_name("a stage '%name'")?;
        match body.names.get(&name) {
            Some(Named::Stage(index)) => Ok((name, *index)),
            Some(_) => Err(self.error_at(at, format!("'%{name}' is not a stage"))),
            None => Err(self.error_at(at, format!("undefined name '%{name}'"))),
        }
    }

    pub(super) fn replica_ref(&self, body: &Body, (value, at): (Value, Pos)) -> Result<ReplicaId> {
        match value {
            Value::Name(name) => match body.names.get(&name) {
                Some(Named::Replica(replica)) => Ok(*replica),
                Some(_) => Err(self.error_at(at, format!("'%{name}' is not a replica"))),
                None => Err(self.error_at(at, format!("undefined name '%{name}'"))),
            },
            _ => Err(self.error_at(at, "expected a replica '%name'")),
        }
    }
}
