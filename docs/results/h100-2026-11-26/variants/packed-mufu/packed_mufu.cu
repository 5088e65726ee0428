
__global__ void k(const float* in, unsigned* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float a = in[2*i], b = in[2*i+1];
  unsigned h; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(b), "f"(a));
  unsigned r;
  asm("ex2.approx.f16x2 %0, %1;" : "=r"(r) : "r"(h));
  out[i] = r;
}
__global__ void k32(const float* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = exp2f(in[i]);
}
__global__ void kb(const float* in, unsigned* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned h, r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(in[2*i]), "f"(in[2*i+1]));
  asm("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(r) : "r"(h));
  out[i] = r;
}
__global__ void t16(const float* in, unsigned* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned h, r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(in[2*i+1]), "f"(in[2*i]));
  asm("tanh.approx.f16x2 %0, %1;" : "=r"(r) : "r"(h));
  out[i] = r;
}
__global__ void t32(const float* in, float* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float r; asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(in[i])); out[i] = r;
}
