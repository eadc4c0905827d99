; ModuleID = 'LLVMDialectModule'
source_filename = "LLVMDialectModule"

declare void @slimpack_rt_forward(i64, i64, i64)

declare void @slimpack_rt_backward(i64, i64, i64)

declare void @slimpack_rt_cp_exchange(i64, i64, i64, i64, ptr, i64)

declare void @slimpack_rt_send(i64, i64, i64, i64, i64, i64)

declare void @slimpack_rt_recv(i64, i64, i64, i64, i64, i64)

declare void @slimpack_rt_reduce_scatter(i64, i64)

declare void @slimpack_rt_optimizer(i64, i64)

declare void @slimpack_rt_all_gather(i64, i64)

define void @slimpack_device_dp0_pp0() {
  call void @slimpack_rt_forward(i64 0, i64 0, i64 0)
  call void @slimpack_rt_forward(i64 0, i64 0, i64 1)
  call void @slimpack_rt_backward(i64 0, i64 0, i64 2)
  call void @slimpack_rt_backward(i64 0, i64 0, i64 3)
  call void @slimpack_rt_reduce_scatter(i64 0, i64 0)
  call void @slimpack_rt_optimizer(i64 0, i64 0)
  call void @slimpack_rt_all_gather(i64 0, i64 0)
  ret void
}

define void @slimpack_device_dp1_pp0() {
  call void @slimpack_rt_forward(i64 1, i64 0, i64 4)
  call void @slimpack_rt_backward(i64 1, i64 0, i64 5)
  call void @slimpack_rt_reduce_scatter(i64 1, i64 0)
  call void @slimpack_rt_optimizer(i64 1, i64 0)
  call void @slimpack_rt_all_gather(i64 1, i64 0)
  ret void
}

define void @slimpack_run_device(i64 %0) {
  %2 = trunc i64 %0 to i32
  switch i32 %2, label %5 [
    i32 0, label %3
    i32 1, label %4
  ]

3:                                                ; preds = %1
  call void @slimpack_device_dp0_pp0()
  br label %6

4:                                                ; preds = %1
  call void @slimpack_device_dp1_pp0()
  br label %6

5:                                                ; preds = %1
  br label %6

6:                                                ; preds = %5, %3, %4
  ret void
}

define void @slimpack_run_step() {
  br label %1

1:                                                ; preds = %4, %0
  %2 = phi i64 [ %5, %4 ], [ 0, %0 ]
  %3 = icmp slt i64 %2, 2
  br i1 %3, label %4, label %6

4:                                                ; preds = %1
  call void @slimpack_run_device(i64 %2)
  %5 = add i64 %2, 1
  br label %1

6:                                                ; preds = %1
  ret void
}

!llvm.module.flags = !{!0}

!0 = !{i32 2, !"Debug Info Version", i32 3}
