module {
  func.func private @slimpack_rt_forward(i64, i64, i64)
  func.func private @slimpack_rt_backward(i64, i64, i64)
  func.func private @slimpack_rt_cp_exchange(i64, i64, i64, i64, !llvm.ptr, i64)
  func.func private @slimpack_rt_send(i64, i64, i64, i64, i64, i64)
  func.func private @slimpack_rt_recv(i64, i64, i64, i64, i64, i64)
  func.func private @slimpack_rt_reduce_scatter(i64, i64)
  func.func private @slimpack_rt_optimizer(i64, i64)
  func.func private @slimpack_rt_all_gather(i64, i64)
  func.func @slimpack_device_dp0_pp0() {
    %v0 = arith.constant 0 : i64
    %v1 = arith.constant 0 : i64
    %v2 = arith.constant 0 : i64
    func.call @slimpack_rt_forward(%v0, %v1, %v2) : (i64, i64, i64) -> ()
    %v3 = arith.constant 0 : i64
    %v4 = arith.constant 0 : i64
    %v5 = arith.constant 1 : i64
    func.call @slimpack_rt_forward(%v3, %v4, %v5) : (i64, i64, i64) -> ()
    %v6 = arith.constant 0 : i64
    %v7 = arith.constant 0 : i64
    %v8 = arith.constant 2 : i64
    func.call @slimpack_rt_backward(%v6, %v7, %v8) : (i64, i64, i64) -> ()
    %v9 = arith.constant 0 : i64
    %v10 = arith.constant 0 : i64
    %v11 = arith.constant 3 : i64
    func.call @slimpack_rt_backward(%v9, %v10, %v11) : (i64, i64, i64) -> ()
    %v12 = arith.constant 0 : i64
    %v13 = arith.constant 0 : i64
    func.call @slimpack_rt_reduce_scatter(%v12, %v13) : (i64, i64) -> ()
    %v14 = arith.constant 0 : i64
    %v15 = arith.constant 0 : i64
    func.call @slimpack_rt_optimizer(%v14, %v15) : (i64, i64) -> ()
    %v16 = arith.constant 0 : i64
    %v17 = arith.constant 0 : i64
    func.call @slimpack_rt_all_gather(%v16, %v17) : (i64, i64) -> ()
    return
  }
  func.func @slimpack_device_dp1_pp0() {
    %v0 = arith.constant 1 : i64
    %v1 = arith.constant 0 : i64
    %v2 = arith.constant 4 : i64
    func.call @slimpack_rt_forward(%v0, %v1, %v2) : (i64, i64, i64) -> ()
    %v3 = arith.constant 1 : i64
    %v4 = arith.constant 0 : i64
    %v5 = arith.constant 5 : i64
    func.call @slimpack_rt_backward(%v3, %v4, %v5) : (i64, i64, i64) -> ()
    %v6 = arith.constant 1 : i64
    %v7 = arith.constant 0 : i64
    func.call @slimpack_rt_reduce_scatter(%v6, %v7) : (i64, i64) -> ()
    %v8 = arith.constant 1 : i64
    %v9 = arith.constant 0 : i64
    func.call @slimpack_rt_optimizer(%v8, %v9) : (i64, i64) -> ()
    %v10 = arith.constant 1 : i64
    %v11 = arith.constant 0 : i64
    func.call @slimpack_rt_all_gather(%v10, %v11) : (i64, i64) -> ()
    return
  }
  func.func @slimpack_run_device(%device: index) {
    scf.index_switch %device
    case 0 {
      func.call @slimpack_device_dp0_pp0() : () -> ()
      scf.yield
    }
    case 1 {
      func.call @slimpack_device_dp1_pp0() : () -> ()
      scf.yield
    }
    default {
    }
    return
  }
  func.func @slimpack_run_step() {
    %first = arith.constant 0 : index
    %one = arith.constant 1 : index
    %devices = arith.constant 2 : index
    scf.for %device = %first to %devices step %one {
      func.call @slimpack_run_device(%device) : (index) -> ()
    }
    return
  }
}
