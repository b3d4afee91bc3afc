#include <cstdio>
#include <cstdlib>
#include <string>
#include <functional>
#include <torch/torch.h>
#include "examples/zoo/Zoo.h"
#include "profiler/Step.h"
using namespace metamem;
struct Fn : TrainingStep {
  std::vector<at::Tensor> t; std::function<at::Tensor(std::vector<at::Tensor>&)> f;
  at::Tensor forward_loss() override { return f(t); }
};
void run(const char* name, std::function<std::vector<at::Tensor>()> mk, std::function<at::Tensor(std::vector<at::Tensor>&)> f) {
  StepBuilder b = [=] { auto s = std::make_unique<Fn>(); s->t = mk(); s->f = f; return s; };
  auto tr = trace_step(b, c10::Device(c10::kCPU));
  long a = achieved_cpu_peak(b);
  std::printf("%-12s pred %10ld ach %10ld diff %ld\n", name, tr.peak_bytes, a, tr.peak_bytes - a);
}
at::Tensor P(std::vector<int64_t> s) { return torch::randn(s).requires_grad_(); }
int main(int argc, char** argv) {
  if (argc > 2) {
    metamem::ZooConfig c; c.model = argv[1]; c.batch = atoi(argv[2]);
    if (argc > 3) { c.image = atoi(argv[3]); c.seq = atoi(argv[3]); }
    if (argc > 4) { c.layers = 2; c.width = 64; c.heads = 4; c.vocab = 100; }
    auto b = metamem::zoo_step(c);
    auto tr = metamem::trace_step(b, c10::Device(c10::kCPU));
    long a = metamem::achieved_cpu_peak(b);
    std::printf("pred %ld achieved %ld diff %ld (%.4f%%)\n", tr.peak_bytes, a, tr.peak_bytes - a, 100.0*(tr.peak_bytes-a)/a);
    return 0;
  }
  run("layernorm", []{ return std::vector<at::Tensor>{P({2,16,64}), P({64}), P({64})}; }, [](auto& t){ return torch::layer_norm(t[0], {64}, t[1], t[2]).pow(2).sum(); });
  run("embedding", []{ return std::vector<at::Tensor>{P({100,64}), torch::zeros({2,16}, torch::kLong)}; }, [](auto& t){ return torch::embedding(t[0], t[1]).pow(2).sum(); });
  run("xent", []{ return std::vector<at::Tensor>{P({32,100}), torch::zeros({32}, torch::kLong)}; }, [](auto& t){ return torch::nn::functional::cross_entropy(t[0], t[1]); });
  run("conv3x3", []{ return std::vector<at::Tensor>{P({2,16,8,8}), P({32,16,3,3})}; }, [](auto& t){ return torch::conv2d(t[0], t[1], {}, 1, 1).pow(2).sum(); });
  run("conv1x1", []{ return std::vector<at::Tensor>{P({2,16,8,8}), P({32,16,1,1})}; }, [](auto& t){ return torch::conv2d(t[0], t[1]).pow(2).sum(); });
  run("conv1x1s2", []{ return std::vector<at::Tensor>{P({2,16,8,8}), P({32,16,1,1})}; }, [](auto& t){ return torch::conv2d(t[0], t[1], {}, 2).pow(2).sum(); });
  run("conv7x7s2", []{ return std::vector<at::Tensor>{P({2,3,32,32}), P({64,3,7,7})}; }, [](auto& t){ return torch::conv2d(t[0], t[1], {}, 2, 3).pow(2).sum(); });
  run("batchnorm", []{ return std::vector<at::Tensor>{P({2,16,8,8}), P({16}), P({16}), torch::zeros({16}), torch::ones({16})}; }, [](auto& t){ return torch::batch_norm(t[0], t[1], t[2], t[3], t[4], true, 0.1, 1e-5, false).pow(2).sum(); });
  run("maxpool", []{ return std::vector<at::Tensor>{P({2,16,8,8})}; }, [](auto& t){ return torch::max_pool2d(t[0], 3, 2, 1).pow(2).sum(); });
  run("avgpool", []{ return std::vector<at::Tensor>{P({2,16,8,8})}; }, [](auto& t){ return torch::adaptive_avg_pool2d(t[0], {1,1}).pow(2).sum(); });
  run("gelu", []{ return std::vector<at::Tensor>{P({2,16,64})}; }, [](auto& t){ return torch::gelu(t[0]).pow(2).sum(); });
  run("softmax", []{ return std::vector<at::Tensor>{P({2,4,16,16}), torch::ones({16,16}, torch::kBool).triu(1)}; }, [](auto& t){ return torch::softmax(t[0].masked_fill(t[1], -INFINITY), -1).pow(2).sum(); });
  run("matmul4d", []{ return std::vector<at::Tensor>{P({2,4,16,16}), P({2,4,16,16})}; }, [](auto& t){ return torch::matmul(t[0], t[1].transpose(-2,-1)).pow(2).sum(); });
  run("linear3d", []{ return std::vector<at::Tensor>{P({2,16,64}), P({192,64}), P({192})}; }, [](auto& t){ return torch::linear(t[0], t[1], t[2]).pow(2).sum(); });
  run("split_view", []{ return std::vector<at::Tensor>{P({2,16,192})}; }, [](auto& t){ auto q = t[0].split(64, 2); return (q[0].view({2,16,4,16}).transpose(1,2).contiguous()).pow(2).sum(); });
  run("dropout", []{ return std::vector<at::Tensor>{P({2,16,64})}; }, [](auto& t){ return torch::dropout(t[0], 0.1, true).pow(2).sum(); });
  run("lmhead", []{ return std::vector<at::Tensor>{P({2,16,64}), P({100,64})}; }, [](auto& t){ return torch::matmul(t[0], t[1].t()).pow(2).sum(); });
}
