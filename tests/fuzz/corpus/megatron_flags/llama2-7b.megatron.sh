# Llama 2 7B model flags as a Megatron-LM pretraining script passes them.
# Megatron derives the vocabulary from the tokenizer; --vocab-size stands in for it here.
GPT_ARGS="
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 11008 \
    --num-attention-heads 32 \
    --seq-length 4096 \
    --max-position-embeddings 4096 \
    --micro-batch-size 1 \
    --global-batch-size 1024 \
    --lr 3.0e-4 \
    --swiglu \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --use-flash-attn \
    --vocab-size 32000 \
    --bf16
"
