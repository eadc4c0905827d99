; ModuleID = 'LLVMDialectModule'
source_filename = "LLVMDialectModule"

@slimpack_group_0 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_1 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_2 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_3 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_4 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_5 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_6 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_7 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_8 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_9 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_10 = internal constant [2 x i64] [i64 1, i64 2]
@slimpack_group_11 = internal constant [2 x i64] [i64 1, i64 2]

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
  call void @slimpack_rt_send(i64 0, i64 0, i64 0, i64 0, i64 0, i64 1)
  call void @slimpack_rt_recv(i64 0, i64 0, i64 1, i64 1, i64 0, i64 1)
  call void @slimpack_rt_backward(i64 0, i64 0, i64 1)
  call void @slimpack_rt_reduce_scatter(i64 0, i64 0)
  call void @slimpack_rt_optimizer(i64 0, i64 0)
  call void @slimpack_rt_all_gather(i64 0, i64 0)
  ret void
}

define void @slimpack_device_dp1_pp0() {
  call void @slimpack_rt_cp_exchange(i64 1, i64 0, i64 2, i64 0, ptr @slimpack_group_0, i64 2)
  call void @slimpack_rt_forward(i64 1, i64 0, i64 2)
  call void @slimpack_rt_send(i64 1, i64 0, i64 2, i64 0, i64 1, i64 1)
  call void @slimpack_rt_recv(i64 1, i64 0, i64 3, i64 1, i64 1, i64 1)
  call void @slimpack_rt_cp_exchange(i64 1, i64 0, i64 3, i64 1, ptr @slimpack_group_1, i64 2)
  call void @slimpack_rt_backward(i64 1, i64 0, i64 3)
  call void @slimpack_rt_recv(i64 1, i64 0, i64 4, i64 1, i64 1, i64 1)
  call void @slimpack_rt_cp_exchange(i64 1, i64 0, i64 4, i64 1, ptr @slimpack_group_2, i64 2)
  call void @slimpack_rt_backward(i64 1, i64 0, i64 4)
  call void @slimpack_rt_reduce_scatter(i64 1, i64 0)
  call void @slimpack_rt_optimizer(i64 1, i64 0)
  call void @slimpack_rt_all_gather(i64 1, i64 0)
  ret void
}

define void @slimpack_device_dp2_pp0() {
  call void @slimpack_rt_cp_exchange(i64 2, i64 0, i64 2, i64 0, ptr @slimpack_group_3, i64 2)
  call void @slimpack_rt_forward(i64 2, i64 0, i64 2)
  call void @slimpack_rt_send(i64 2, i64 0, i64 2, i64 0, i64 2, i64 1)
  call void @slimpack_rt_recv(i64 2, i64 0, i64 3, i64 1, i64 2, i64 1)
  call void @slimpack_rt_cp_exchange(i64 2, i64 0, i64 3, i64 1, ptr @slimpack_group_4, i64 2)
  call void @slimpack_rt_backward(i64 2, i64 0, i64 3)
  call void @slimpack_rt_recv(i64 2, i64 0, i64 4, i64 1, i64 2, i64 1)
  call void @slimpack_rt_cp_exchange(i64 2, i64 0, i64 4, i64 1, ptr @slimpack_group_5, i64 2)
  call void @slimpack_rt_backward(i64 2, i64 0, i64 4)
  call void @slimpack_rt_reduce_scatter(i64 2, i64 0)
  call void @slimpack_rt_optimizer(i64 2, i64 0)
  call void @slimpack_rt_all_gather(i64 2, i64 0)
  ret void
}

define void @slimpack_device_dp0_pp1() {
  call void @slimpack_rt_recv(i64 0, i64 1, i64 0, i64 0, i64 0, i64 0)
  call void @slimpack_rt_forward(i64 0, i64 1, i64 0)
  call void @slimpack_rt_backward(i64 0, i64 1, i64 1)
  call void @slimpack_rt_send(i64 0, i64 1, i64 1, i64 1, i64 0, i64 0)
  call void @slimpack_rt_reduce_scatter(i64 0, i64 1)
  call void @slimpack_rt_optimizer(i64 0, i64 1)
  call void @slimpack_rt_all_gather(i64 0, i64 1)
  ret void
}

define void @slimpack_device_dp1_pp1() {
  call void @slimpack_rt_recv(i64 1, i64 1, i64 2, i64 0, i64 1, i64 0)
  call void @slimpack_rt_cp_exchange(i64 1, i64 1, i64 2, i64 0, ptr @slimpack_group_6, i64 2)
  call void @slimpack_rt_forward(i64 1, i64 1, i64 2)
  call void @slimpack_rt_cp_exchange(i64 1, i64 1, i64 3, i64 1, ptr @slimpack_group_7, i64 2)
  call void @slimpack_rt_backward(i64 1, i64 1, i64 3)
  call void @slimpack_rt_send(i64 1, i64 1, i64 3, i64 1, i64 1, i64 0)
  call void @slimpack_rt_cp_exchange(i64 1, i64 1, i64 4, i64 1, ptr @slimpack_group_8, i64 2)
  call void @slimpack_rt_backward(i64 1, i64 1, i64 4)
  call void @slimpack_rt_send(i64 1, i64 1, i64 4, i64 1, i64 1, i64 0)
  call void @slimpack_rt_reduce_scatter(i64 1, i64 1)
  call void @slimpack_rt_optimizer(i64 1, i64 1)
  call void @slimpack_rt_all_gather(i64 1, i64 1)
  ret void
}

define void @slimpack_device_dp2_pp1() {
  call void @slimpack_rt_recv(i64 2, i64 1, i64 2, i64 0, i64 2, i64 0)
  call void @slimpack_rt_cp_exchange(i64 2, i64 1, i64 2, i64 0, ptr @slimpack_group_9, i64 2)
  call void @slimpack_rt_forward(i64 2, i64 1, i64 2)
  call void @slimpack_rt_cp_exchange(i64 2, i64 1, i64 3, i64 1, ptr @slimpack_group_10, i64 2)
  call void @slimpack_rt_backward(i64 2, i64 1, i64 3)
  call void @slimpack_rt_send(i64 2, i64 1, i64 3, i64 1, i64 2, i64 0)
  call void @slimpack_rt_cp_exchange(i64 2, i64 1, i64 4, i64 1, ptr @slimpack_group_11, i64 2)
  call void @slimpack_rt_backward(i64 2, i64 1, i64 4)
  call void @slimpack_rt_send(i64 2, i64 1, i64 4, i64 1, i64 2, i64 0)
  call void @slimpack_rt_reduce_scatter(i64 2, i64 1)
  call void @slimpack_rt_optimizer(i64 2, i64 1)
  call void @slimpack_rt_all_gather(i64 2, i64 1)
  ret void
}

define void @slimpack_run_device(i64 %0) {
  %2 = trunc i64 %0 to i32
  switch i32 %2, label %9 [
    i32 0, label %3
    i32 1, label %4
    i32 2, label %5
    i32 3, label %6
    i32 4, label %7
    i32 5, label %8
  ]

3:                                                ; preds = %1
  call void @slimpack_device_dp0_pp0()
  br label %10

4:                                                ; preds = %1
  call void @slimpack_device_dp1_pp0()
  br label %10

5:                                                ; preds = %1
  call void @slimpack_device_dp2_pp0()
  br label %10

6:                                                ; preds = %1
  call void @slimpack_device_dp0_pp1()
  br label %10

7:                                                ; preds = %1
  call void @slimpack_device_dp1_pp1()
  br label %10

8:                                                ; preds = %1
  call void @slimpack_device_dp2_pp1()
  br label %10

9:                                                ; preds = %1
  br label %10

10:                                               ; preds = %9, %3, %4, %5, %6, %7, %8
  ret void
}

define void @slimpack_run_step() {
  br label %1

1:                                                ; preds = %4, %0
  %2 = phi i64 [ %5, %4 ], [ 0, %0 ]
  %3 = icmp slt i64 %2, 6
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
