module {
  llvm.mlir.global internal constant @slimpack_group_0(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_1(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_2(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_3(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_4(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_5(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_6(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_7(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_8(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_9(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_10(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
  llvm.mlir.global internal constant @slimpack_group_11(dense<[1, 2]> : tensor<2xi64>) {addr_space = 0 : i32} : !llvm.array<2 x i64>
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
    %v5 = arith.constant 0 : i64
    %v6 = arith.constant 0 : i64
    %v7 = arith.constant 0 : i64
    %v8 = arith.constant 1 : i64
    func.call @slimpack_rt_send(%v3, %v4, %v5, %v6, %v7, %v8) : (i64, i64, i64, i64, i64, i64) -> ()
    %v9 = arith.constant 0 : i64
    %v10 = arith.constant 0 : i64
    %v11 = arith.constant 1 : i64
    %v12 = arith.constant 1 : i64
    %v13 = arith.constant 0 : i64
    %v14 = arith.constant 1 : i64
    func.call @slimpack_rt_recv(%v9, %v10, %v11, %v12, %v13, %v14) : (i64, i64, i64, i64, i64, i64) -> ()
    %v15 = arith.constant 0 : i64
    %v16 = arith.constant 0 : i64
    %v17 = arith.constant 1 : i64
    func.call @slimpack_rt_backward(%v15, %v16, %v17) : (i64, i64, i64) -> ()
    %v18 = arith.constant 0 : i64
    %v19 = arith.constant 0 : i64
    func.call @slimpack_rt_reduce_scatter(%v18, %v19) : (i64, i64) -> ()
    %v20 = arith.constant 0 : i64
    %v21 = arith.constant 0 : i64
    func.call @slimpack_rt_optimizer(%v20, %v21) : (i64, i64) -> ()
    %v22 = arith.constant 0 : i64
    %v23 = arith.constant 0 : i64
    func.call @slimpack_rt_all_gather(%v22, %v23) : (i64, i64) -> ()
    return
  }
  func.func @slimpack_device_dp1_pp0() {
    %v0 = arith.constant 1 : i64
    %v1 = arith.constant 0 : i64
    %v2 = arith.constant 2 : i64
    %v3 = arith.constant 0 : i64
    %v4 = llvm.mlir.addressof @slimpack_group_0 : !llvm.ptr
    %v5 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v0, %v1, %v2, %v3, %v4, %v5) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v6 = arith.constant 1 : i64
    %v7 = arith.constant 0 : i64
    %v8 = arith.constant 2 : i64
    func.call @slimpack_rt_forward(%v6, %v7, %v8) : (i64, i64, i64) -> ()
    %v9 = arith.constant 1 : i64
    %v10 = arith.constant 0 : i64
    %v11 = arith.constant 2 : i64
    %v12 = arith.constant 0 : i64
    %v13 = arith.constant 1 : i64
    %v14 = arith.constant 1 : i64
    func.call @slimpack_rt_send(%v9, %v10, %v11, %v12, %v13, %v14) : (i64, i64, i64, i64, i64, i64) -> ()
    %v15 = arith.constant 1 : i64
    %v16 = arith.constant 0 : i64
    %v17 = arith.constant 3 : i64
    %v18 = arith.constant 1 : i64
    %v19 = arith.constant 1 : i64
    %v20 = arith.constant 1 : i64
    func.call @slimpack_rt_recv(%v15, %v16, %v17, %v18, %v19, %v20) : (i64, i64, i64, i64, i64, i64) -> ()
    %v21 = arith.constant 1 : i64
    %v22 = arith.constant 0 : i64
    %v23 = arith.constant 3 : i64
    %v24 = arith.constant 1 : i64
    %v25 = llvm.mlir.addressof @slimpack_group_1 : !llvm.ptr
    %v26 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v21, %v22, %v23, %v24, %v25, %v26) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v27 = arith.constant 1 : i64
    %v28 = arith.constant 0 : i64
    %v29 = arith.constant 3 : i64
    func.call @slimpack_rt_backward(%v27, %v28, %v29) : (i64, i64, i64) -> ()
    %v30 = arith.constant 1 : i64
    %v31 = arith.constant 0 : i64
    %v32 = arith.constant 4 : i64
    %v33 = arith.constant 1 : i64
    %v34 = arith.constant 1 : i64
    %v35 = arith.constant 1 : i64
    func.call @slimpack_rt_recv(%v30, %v31, %v32, %v33, %v34, %v35) : (i64, i64, i64, i64, i64, i64) -> ()
    %v36 = arith.constant 1 : i64
    %v37 = arith.constant 0 : i64
    %v38 = arith.constant 4 : i64
    %v39 = arith.constant 1 : i64
    %v40 = llvm.mlir.addressof @slimpack_group_2 : !llvm.ptr
    %v41 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v36, %v37, %v38, %v39, %v40, %v41) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v42 = arith.constant 1 : i64
    %v43 = arith.constant 0 : i64
    %v44 = arith.constant 4 : i64
    func.call @slimpack_rt_backward(%v42, %v43, %v44) : (i64, i64, i64) -> ()
    %v45 = arith.constant 1 : i64
    %v46 = arith.constant 0 : i64
    func.call @slimpack_rt_reduce_scatter(%v45, %v46) : (i64, i64) -> ()
    %v47 = arith.constant 1 : i64
    %v48 = arith.constant 0 : i64
    func.call @slimpack_rt_optimizer(%v47, %v48) : (i64, i64) -> ()
    %v49 = arith.constant 1 : i64
    %v50 = arith.constant 0 : i64
    func.call @slimpack_rt_all_gather(%v49, %v50) : (i64, i64) -> ()
    return
  }
  func.func @slimpack_device_dp2_pp0() {
    %v0 = arith.constant 2 : i64
    %v1 = arith.constant 0 : i64
    %v2 = arith.constant 2 : i64
    %v3 = arith.constant 0 : i64
    %v4 = llvm.mlir.addressof @slimpack_group_3 : !llvm.ptr
    %v5 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v0, %v1, %v2, %v3, %v4, %v5) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v6 = arith.constant 2 : i64
    %v7 = arith.constant 0 : i64
    %v8 = arith.constant 2 : i64
    func.call @slimpack_rt_forward(%v6, %v7, %v8) : (i64, i64, i64) -> ()
    %v9 = arith.constant 2 : i64
    %v10 = arith.constant 0 : i64
    %v11 = arith.constant 2 : i64
    %v12 = arith.constant 0 : i64
    %v13 = arith.constant 2 : i64
    %v14 = arith.constant 1 : i64
    func.call @slimpack_rt_send(%v9, %v10, %v11, %v12, %v13, %v14) : (i64, i64, i64, i64, i64, i64) -> ()
    %v15 = arith.constant 2 : i64
    %v16 = arith.constant 0 : i64
    %v17 = arith.constant 3 : i64
    %v18 = arith.constant 1 : i64
    %v19 = arith.constant 2 : i64
    %v20 = arith.constant 1 : i64
    func.call @slimpack_rt_recv(%v15, %v16, %v17, %v18, %v19, %v20) : (i64, i64, i64, i64, i64, i64) -> ()
    %v21 = arith.constant 2 : i64
    %v22 = arith.constant 0 : i64
    %v23 = arith.constant 3 : i64
    %v24 = arith.constant 1 : i64
    %v25 = llvm.mlir.addressof @slimpack_group_4 : !llvm.ptr
    %v26 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v21, %v22, %v23, %v24, %v25, %v26) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v27 = arith.constant 2 : i64
    %v28 = arith.constant 0 : i64
    %v29 = arith.constant 3 : i64
    func.call @slimpack_rt_backward(%v27, %v28, %v29) : (i64, i64, i64) -> ()
    %v30 = arith.constant 2 : i64
    %v31 = arith.constant 0 : i64
    %v32 = arith.constant 4 : i64
    %v33 = arith.constant 1 : i64
    %v34 = arith.constant 2 : i64
    %v35 = arith.constant 1 : i64
    func.call @slimpack_rt_recv(%v30, %v31, %v32, %v33, %v34, %v35) : (i64, i64, i64, i64, i64, i64) -> ()
    %v36 = arith.constant 2 : i64
    %v37 = arith.constant 0 : i64
    %v38 = arith.constant 4 : i64
    %v39 = arith.constant 1 : i64
    %v40 = llvm.mlir.addressof @slimpack_group_5 : !llvm.ptr
    %v41 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v36, %v37, %v38, %v39, %v40, %v41) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v42 = arith.constant 2 : i64
    %v43 = arith.constant 0 : i64
    %v44 = arith.constant 4 : i64
    func.call @slimpack_rt_backward(%v42, %v43, %v44) : (i64, i64, i64) -> ()
    %v45 = arith.constant 2 : i64
    %v46 = arith.constant 0 : i64
    func.call @slimpack_rt_reduce_scatter(%v45, %v46) : (i64, i64) -> ()
    %v47 = arith.constant 2 : i64
    %v48 = arith.constant 0 : i64
    func.call @slimpack_rt_optimizer(%v47, %v48) : (i64, i64) -> ()
    %v49 = arith.constant 2 : i64
    %v50 = arith.constant 0 : i64
    func.call @slimpack_rt_all_gather(%v49, %v50) : (i64, i64) -> ()
    return
  }
  func.func @slimpack_device_dp0_pp1() {
    %v0 = arith.constant 0 : i64
    %v1 = arith.constant 1 : i64
    %v2 = arith.constant 0 : i64
    %v3 = arith.constant 0 : i64
    %v4 = arith.constant 0 : i64
    %v5 = arith.constant 0 : i64
    func.call @slimpack_rt_recv(%v0, %v1, %v2, %v3, %v4, %v5) : (i64, i64, i64, i64, i64, i64) -> ()
    %v6 = arith.constant 0 : i64
    %v7 = arith.constant 1 : i64
    %v8 = arith.constant 0 : i64
    func.call @slimpack_rt_forward(%v6, %v7, %v8) : (i64, i64, i64) -> ()
    %v9 = arith.constant 0 : i64
    %v10 = arith.constant 1 : i64
    %v11 = arith.constant 1 : i64
    func.call @slimpack_rt_backward(%v9, %v10, %v11) : (i64, i64, i64) -> ()
    %v12 = arith.constant 0 : i64
    %v13 = arith.constant 1 : i64
    %v14 = arith.constant 1 : i64
    %v15 = arith.constant 1 : i64
    %v16 = arith.constant 0 : i64
    %v17 = arith.constant 0 : i64
    func.call @slimpack_rt_send(%v12, %v13, %v14, %v15, %v16, %v17) : (i64, i64, i64, i64, i64, i64) -> ()
    %v18 = arith.constant 0 : i64
    %v19 = arith.constant 1 : i64
    func.call @slimpack_rt_reduce_scatter(%v18, %v19) : (i64, i64) -> ()
    %v20 = arith.constant 0 : i64
    %v21 = arith.constant 1 : i64
    func.call @slimpack_rt_optimizer(%v20, %v21) : (i64, i64) -> ()
    %v22 = arith.constant 0 : i64
    %v23 = arith.constant 1 : i64
    func.call @slimpack_rt_all_gather(%v22, %v23) : (i64, i64) -> ()
    return
  }
  func.func @slimpack_device_dp1_pp1() {
    %v0 = arith.constant 1 : i64
    %v1 = arith.constant 1 : i64
    %v2 = arith.constant 2 : i64
    %v3 = arith.constant 0 : i64
    %v4 = arith.constant 1 : i64
    %v5 = arith.constant 0 : i64
    func.call @slimpack_rt_recv(%v0, %v1, %v2, %v3, %v4, %v5) : (i64, i64, i64, i64, i64, i64) -> ()
    %v6 = arith.constant 1 : i64
    %v7 = arith.constant 1 : i64
    %v8 = arith.constant 2 : i64
    %v9 = arith.constant 0 : i64
    %v10 = llvm.mlir.addressof @slimpack_group_6 : !llvm.ptr
    %v11 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v6, %v7, %v8, %v9, %v10, %v11) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v12 = arith.constant 1 : i64
    %v13 = arith.constant 1 : i64
    %v14 = arith.constant 2 : i64
    func.call @slimpack_rt_forward(%v12, %v13, %v14) : (i64, i64, i64) -> ()
    %v15 = arith.constant 1 : i64
    %v16 = arith.constant 1 : i64
    %v17 = arith.constant 3 : i64
    %v18 = arith.constant 1 : i64
    %v19 = llvm.mlir.addressof @slimpack_group_7 : !llvm.ptr
    %v20 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v15, %v16, %v17, %v18, %v19, %v20) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v21 = arith.constant 1 : i64
    %v22 = arith.constant 1 : i64
    %v23 = arith.constant 3 : i64
    func.call @slimpack_rt_backward(%v21, %v22, %v23) : (i64, i64, i64) -> ()
    %v24 = arith.constant 1 : i64
    %v25 = arith.constant 1 : i64
    %v26 = arith.constant 3 : i64
    %v27 = arith.constant 1 : i64
    %v28 = arith.constant 1 : i64
    %v29 = arith.constant 0 : i64
    func.call @slimpack_rt_send(%v24, %v25, %v26, %v27, %v28, %v29) : (i64, i64, i64, i64, i64, i64) -> ()
    %v30 = arith.constant 1 : i64
    %v31 = arith.constant 1 : i64
    %v32 = arith.constant 4 : i64
    %v33 = arith.constant 1 : i64
    %v34 = llvm.mlir.addressof @slimpack_group_8 : !llvm.ptr
    %v35 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v30, %v31, %v32, %v33, %v34, %v35) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v36 = arith.constant 1 : i64
    %v37 = arith.constant 1 : i64
    %v38 = arith.constant 4 : i64
    func.call @slimpack_rt_backward(%v36, %v37, %v38) : (i64, i64, i64) -> ()
    %v39 = arith.constant 1 : i64
    %v40 = arith.constant 1 : i64
    %v41 = arith.constant 4 : i64
    %v42 = arith.constant 1 : i64
    %v43 = arith.constant 1 : i64
    %v44 = arith.constant 0 : i64
    func.call @slimpack_rt_send(%v39, %v40, %v41, %v42, %v43, %v44) : (i64, i64, i64, i64, i64, i64) -> ()
    %v45 = arith.constant 1 : i64
    %v46 = arith.constant 1 : i64
    func.call @slimpack_rt_reduce_scatter(%v45, %v46) : (i64, i64) -> ()
    %v47 = arith.constant 1 : i64
    %v48 = arith.constant 1 : i64
    func.call @slimpack_rt_optimizer(%v47, %v48) : (i64, i64) -> ()
    %v49 = arith.constant 1 : i64
    %v50 = arith.constant 1 : i64
    func.call @slimpack_rt_all_gather(%v49, %v50) : (i64, i64) -> ()
    return
  }
  func.func @slimpack_device_dp2_pp1() {
    %v0 = arith.constant 2 : i64
    %v1 = arith.constant 1 : i64
    %v2 = arith.constant 2 : i64
    %v3 = arith.constant 0 : i64
    %v4 = arith.constant 2 : i64
    %v5 = arith.constant 0 : i64
    func.call @slimpack_rt_recv(%v0, %v1, %v2, %v3, %v4, %v5) : (i64, i64, i64, i64, i64, i64) -> ()
    %v6 = arith.constant 2 : i64
    %v7 = arith.constant 1 : i64
    %v8 = arith.constant 2 : i64
    %v9 = arith.constant 0 : i64
    %v10 = llvm.mlir.addressof @slimpack_group_9 : !llvm.ptr
    %v11 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v6, %v7, %v8, %v9, %v10, %v11) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v12 = arith.constant 2 : i64
    %v13 = arith.constant 1 : i64
    %v14 = arith.constant 2 : i64
    func.call @slimpack_rt_forward(%v12, %v13, %v14) : (i64, i64, i64) -> ()
    %v15 = arith.constant 2 : i64
    %v16 = arith.constant 1 : i64
    %v17 = arith.constant 3 : i64
    %v18 = arith.constant 1 : i64
    %v19 = llvm.mlir.addressof @slimpack_group_10 : !llvm.ptr
    %v20 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v15, %v16, %v17, %v18, %v19, %v20) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v21 = arith.constant 2 : i64
    %v22 = arith.constant 1 : i64
    %v23 = arith.constant 3 : i64
    func.call @slimpack_rt_backward(%v21, %v22, %v23) : (i64, i64, i64) -> ()
    %v24 = arith.constant 2 : i64
    %v25 = arith.constant 1 : i64
    %v26 = arith.constant 3 : i64
    %v27 = arith.constant 1 : i64
    %v28 = arith.constant 2 : i64
    %v29 = arith.constant 0 : i64
    func.call @slimpack_rt_send(%v24, %v25, %v26, %v27, %v28, %v29) : (i64, i64, i64, i64, i64, i64) -> ()
    %v30 = arith.constant 2 : i64
    %v31 = arith.constant 1 : i64
    %v32 = arith.constant 4 : i64
    %v33 = arith.constant 1 : i64
    %v34 = llvm.mlir.addressof @slimpack_group_11 : !llvm.ptr
    %v35 = arith.constant 2 : i64
    func.call @slimpack_rt_cp_exchange(%v30, %v31, %v32, %v33, %v34, %v35) : (i64, i64, i64, i64, !llvm.ptr, i64) -> ()
    %v36 = arith.constant 2 : i64
    %v37 = arith.constant 1 : i64
    %v38 = arith.constant 4 : i64
    func.call @slimpack_rt_backward(%v36, %v37, %v38) : (i64, i64, i64) -> ()
    %v39 = arith.constant 2 : i64
    %v40 = arith.constant 1 : i64
    %v41 = arith.constant 4 : i64
    %v42 = arith.constant 1 : i64
    %v43 = arith.constant 2 : i64
    %v44 = arith.constant 0 : i64
    func.call @slimpack_rt_send(%v39, %v40, %v41, %v42, %v43, %v44) : (i64, i64, i64, i64, i64, i64) -> ()
    %v45 = arith.constant 2 : i64
    %v46 = arith.constant 1 : i64
    func.call @slimpack_rt_reduce_scatter(%v45, %v46) : (i64, i64) -> ()
    %v47 = arith.constant 2 : i64
    %v48 = arith.constant 1 : i64
    func.call @slimpack_rt_optimizer(%v47, %v48) : (i64, i64) -> ()
    %v49 = arith.constant 2 : i64
    %v50 = arith.constant 1 : i64
    func.call @slimpack_rt_all_gather(%v49, %v50) : (i64, i64) -> ()
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
    case 2 {
      func.call @slimpack_device_dp2_pp0() : () -> ()
      scf.yield
    }
    case 3 {
      func.call @slimpack_device_dp0_pp1() : () -> ()
      scf.yield
    }
    case 4 {
      func.call @slimpack_device_dp1_pp1() : () -> ()
      scf.yield
    }
    case 5 {
      func.call @slimpack_device_dp2_pp1() : () -> ()
      scf.yield
    }
    default {
    }
    return
  }
  func.func @slimpack_run_step() {
    %first = arith.constant 0 : index
    %one = arith.constant 1 : index
    %devices = arith.constant 6 : index
    scf.for %device = %first to %devices step %one {
      func.call @slimpack_run_device(%device) : (index) -> ()
    }
    return
  }
}
