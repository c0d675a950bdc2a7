"""The dashboard's and figures' string table, English and 中文 (Chinese).

Terms follow the course textbook: 分块预填充 chunked prefill, 队首阻塞 head-of-line blocking, 准入 admission,
牺牲者 victim, 序列槽位 sequence slot, 预填充 prefill, 解码 decode, 前缀缓存命中 prefix cache hit, 抢占 preemption,
块表 block table, 槽位映射 slot mapping, 词元预算 token budget. Strings with ``{name}`` fields are ``str.format``
templates; callers fill them after ``t``.
"""

from __future__ import annotations

LANGUAGES = ("en", "zh")

# key -> (English, 中文). One flat table so that a missing translation is easy to spot in review.
_STRINGS: dict[str, tuple[str, str]] = {
    # ---- terms ------------------------------------------------------------------------------------------
    "chunked_prefill": ("chunked prefill", "分块预填充"),
    "head_of_line_blocking": ("head-of-line blocking", "队首阻塞"),
    "admission": ("admission", "准入"),
    "victim": ("victim", "牺牲者"),
    "sequence_slot": ("sequence slot", "序列槽位"),
    "prefill": ("prefill", "预填充"),
    "decode": ("decode", "解码"),
    "prefix_cache_hit": ("prefix cache hit", "前缀缓存命中"),
    "preemption": ("preemption", "抢占"),
    "block_table": ("block table", "块表"),
    "slot_mapping": ("slot mapping", "槽位映射"),
    "token_budget": ("token budget", "词元预算"),
    "request": ("request", "请求"),
    "requests_by_colour": ("requests: one colour each (hover a bar for its id)", "请求：每个一种颜色（悬停查看其 id）"),
    # ---- figure titles and axes (units in brackets) ------------------------------------------------------
    "kv_cache_group_full": ("Full-attention layers' KV cache group", "全注意力层的 KV 缓存组"),
    "kv_cache_group_windowed": ("Sliding-window layers' KV cache group", "滑动窗口层的 KV 缓存组"),
    "block_pool_title": ("KV block pool at step {step} ({used} of {total} blocks in use)",
                         "第 {step} 步的 KV 块池（已用 {used} / {total} 块）"),
    "block_tables_title": ("Block tables at step {step}: logical block → physical block",
                           "第 {step} 步的块表：逻辑块 → 物理块"),
    "block_column": ("block id mod {cols}", "块号 mod {cols}"),
    "block_row": ("block id ÷ {cols}", "块号 ÷ {cols}"),
    "logical_block": ("logical block index", "逻辑块序号"),
    "logical_block_wrapped": ("logical block (row “+{cols}” goes on from block {cols})",
                              "逻辑块序号（“+{cols}”行从第 {cols} 块接着排）"),
    "free_block": ("free", "空闲"),
    "cached_free_block": ("cached, free (evictable prefix)", "已缓存但空闲（可驱逐的前缀）"),
    "shared_block": ("shared by several requests (number = ref count)", "多个请求共享（数字 = 引用计数）"),
    "hover_pool_block": ("block {block}<br>{state}<br>ref count {ref}", "块 {block}<br>{state}<br>引用计数 {ref}"),
    "hover_released_cell": ("request {rid}<br>logical block {logical}: given back (outside the sliding window)",
                            "请求 {rid}<br>逻辑块 {logical}：已归还（在滑动窗口之外）"),
    "hover_table_cell": ("request {rid}<br>logical block {logical} → physical block {physical}<br>ref count {ref}",
                         "请求 {rid}<br>逻辑块 {logical} → 物理块 {physical}<br>引用计数 {ref}"),
    "owned_by": ("owned by {owners}", "属于 {owners}"),
    "no_running": ("no running request at this step", "此步没有运行中的请求"),
    # figure titles stay within ~55 characters: the A/B tab draws them in half-width columns, where longer ones
    # were cut at the right on a 1,280-1,440 px wide window
    "batch_title": ("Batch per step (hatched = prefill chunk, solid = decode)",
                    "每步的批次组成（斜线 = 预填充分块，实心 = 解码）"),
    "step_axis": ("step", "步"),
    "tokens_per_step": ("tokens in the step (tokens)", "本步词元数（词元）"),
    "prefill_chunk": ("prefill chunk", "预填充分块"),
    "proposed": ("proposed", "提议"),
    "accepted_proposals": ("accepted proposals", "被接受的提议"),
    "rejected_proposals": ("rejected proposals", "被拒绝的提议"),
    "admitted": ("admitted", "准入"),
    "preempted": ("preempted (victim)", "被抢占（牺牲者）"),
    "finished": ("finished", "完成"),
    "token_timeline_title": ("When each request's tokens came out", "每个请求的词元何时产出"),
    "time_since_arrival": ("time since first arrival (s)", "距首个请求到达的时间（秒）"),
    "time_since_first_step": ("time since first step (s)", "距第一步开始的时间（秒）"),
    "arrival": ("arrival", "到达"),
    "first_scheduled": ("first scheduled", "首次调度"),
    "first_token": ("first token", "首个词元"),
    "output_token": ("output token", "输出词元"),
    "itl_title": ("Inter-token latency (TBT), stalls above {threshold_ms:.1f} ms marked",
                  "词元间延迟（ITL/TBT）；标出超过 {threshold_ms:.1f} 毫秒的停顿"),
    "itl_axis": ("inter-token latency (ms)", "词元间延迟（毫秒）"),
    "itl": ("ITL", "词元间延迟"),
    "stall": ("stall", "停顿"),
    "threshold": ("threshold", "阈值"),
    "ms": ("ms", "毫秒"),
    "queue_title": ("Running and waiting requests over time", "运行与等待请求数随时间变化"),
    "num_requests_axis": ("requests", "请求数"),
    "running": ("running", "运行中"),
    "waiting": ("waiting", "等待中"),
    "kv_title": ("KV blocks over time", "KV 块随时间变化"),
    "blocks_axis": ("KV blocks (blocks)", "KV 块（块）"),
    "used_blocks": ("used", "已用"),
    "free_uncached_blocks": ("free", "空闲"),
    "latency_title": ("Latency distributions (CDF)", "延迟分布（累积分布）"),
    "ttft_ms": ("TTFT (ms)", "首词元延迟 TTFT（毫秒）"),
    "tpot_ms": ("TPOT (ms)", "每词元时间 TPOT（毫秒）"),
    "fraction_axis": ("fraction of requests", "请求比例"),
    "predicted": ("predicted", "预测"),
    "true_len": ("true", "真实"),
    "perfect_prediction": ("predicted = true", "预测 = 真实"),
    "within_2x": ("within a factor of 2", "两倍以内"),
    "predicted_vs_true_title": ("Predicted vs true output length {name}", "预测与真实输出长度 {name}"),
    "true_len_axis": ("true output length (tokens)", "真实输出长度（词元）"),
    "predicted_len_axis": ("predicted output length (tokens)", "预测输出长度（词元）"),
    "policy_latency_title": ("Latency by scheduling policy and predictor", "各调度策略与预测器的延迟"),
    "latency_s_axis": ("latency (s)", "延迟（秒）"),
    "no_data": ("no data", "无数据"),
    # ---- stall causes (find_stalls) ----------------------------------------------------------------------
    "cause_prefill": ("step {step}: {tokens:,}-token prefill of request {rid}",
                      "第 {step} 步：请求 {rid} 的 {tokens:,} 词元预填充"),
    "cause_preempted": ("step {step}: request {rid} preempted, its K/V recomputed",
                        "第 {step} 步：请求 {rid} 被抢占，其 K/V 需重算"),
    "cause_batch": ("step {step}: {tokens:,}-token batch of {num} requests",
                    "第 {step} 步：{num} 个请求共 {tokens:,} 词元的批次"),
    "cause_not_scheduled": ("request {rid} not scheduled for {num} steps", "请求 {rid} 有 {num} 步未被调度"),
    # the short forms label the largest stalls in the ITL figure
    "short_prefill": ("step {step}: {tokens:,}-token prefill of {rid}", "第 {step} 步：{rid} 的 {tokens:,} 词元预填充"),
    "short_preempted": ("step {step}: {rid} preempted", "第 {step} 步：{rid} 被抢占"),
    "short_batch": ("step {step}: {tokens:,}-token batch", "第 {step} 步：{tokens:,} 词元的批次"),
    # ---- what the scheduler decided, in words (step_story) ----------------------------------------------------
    "story_step": ("step {step}: ", "第 {step} 步："),
    "story_nothing": ("nothing scheduled", "没有调度任何请求"),
    "story_decode": ("1 decode", "1 个解码"),
    "story_decodes": ("{n} decodes", "{n} 个解码"),
    "story_spec": (" ({n} verifying {proposed} proposals, {accepted} accepted)",
                   "（其中 {n} 个验证 {proposed} 个提议，接受 {accepted} 个）"),
    "story_chunk": ("a {tokens:,}-token chunk of {rid}", "{rid} 的一个 {tokens:,} 词元分块"),
    "story_last_chunk": ("the last {tokens:,}-token chunk of {rid}", "{rid} 的最后一个 {tokens:,} 词元分块"),
    "story_whole_prefill": ("{rid}'s whole {tokens:,}-token prefill", "{rid} 的完整 {tokens:,} 词元预填充"),
    "story_hit_prefill": ("{rid}'s {tokens:,}-token prefill after a {cached:,}-token prefix-cache hit",
                          "{rid} 在前缀缓存命中 {cached:,} 词元之后的 {tokens:,} 词元预填充"),
    "story_hit_chunk": ("a {tokens:,}-token chunk of {rid} after a {cached:,}-token prefix-cache hit",
                        "{rid} 在前缀缓存命中 {cached:,} 词元之后的一个 {tokens:,} 词元分块"),
    "story_admitted": ("{ids} admitted", "{ids} 被准入"),
    "story_preempted": ("{ids} preempted (no free block; {why})", "{ids} 被抢占（没有空闲块；{why}）"),
    "story_recompute": ("its K/V to be recomputed", "其 K/V 之后重算"),  # one request preempted
    "story_recompute_many": ("their K/V to be recomputed", "它们的 K/V 之后重算"),  # two or more
    "story_swapped_out": ("{blocks:,} blocks swapped out to the CPU", "{blocks:,} 个块换出到 CPU"),
    "story_swapped_out_one": ("1 block swapped out to the CPU", "1 个块换出到 CPU"),
    "story_swapped_in": ("{blocks:,} blocks swapped back in", "{blocks:,} 个块换回"),
    "story_swapped_in_one": ("1 block swapped back in", "1 个块换回"),
    "story_finished": ("{ids} finished", "{ids} 完成"),
    "story_timed_out": ("{ids} timed out", "{ids} 超时"),
    "story_waiting": ("{n} waiting", "{n} 个等待"),
    "story_more": (" and {n} more", " 等另外 {n} 个"),
    # ---- dashboard -----------------------------------------------------------------------------------------
    "app_title": ("minengine: watch the scheduler", "minengine：观察调度器"),
    "app_intro": ("Runs the real engine (the bundled tiny model, on this CPU) step by step and draws what the "
                  "scheduler did. Every number comes from the engine's step trace.",
                  "在本机 CPU 上逐步运行真实引擎（内置小模型），并画出调度器每一步做了什么。"
                  "所有数字都来自引擎的步骤轨迹。"),
    "language": ("Language / 语言", "Language / 语言"),
    "workload": ("Workload", "负载"),
    "preset": ("Workload preset", "负载预设"),
    "preset_a": ("(a) long prompt + 10 decodes", "(a) 长提示 + 10 个解码"),
    "preset_b": ("(b) shared system prompt", "(b) 共享系统提示"),
    "preset_c": ("(c) memory pressure", "(c) 内存压力"),
    "preset_d": ("(d) Azure trace replay", "(d) Azure 轨迹回放"),
    "preset_e": ("(e) custom", "(e) 自定义"),
    "preset_f": ("(f) speculative decoding", "(f) 投机解码"),
    "preset_a_help": ("The textbook case: 10 requests are decoding when one long prompt arrives. Without {cp} its "
                      "prefill takes a whole step and every decode stalls ({hol}).",
                      "教科书案例：10 个请求正在解码时到达一个长提示。没有{cp}时，"
                      "它的预填充独占一步，所有解码都停顿（{hol}）。"),
    "preset_b_help": ("Every request starts with the same long system prompt: after the first, its full blocks "
                      "are {hit}s and are shared (ref count > 1).",
                      "每个请求都以同一个长系统提示开头：第一个之后，其完整块都是{hit}，并被共享（引用计数 > 1）。"),
    "preset_c_help": ("More requests than the KV pool can hold: the scheduler preempts the most recently "
                      "admitted request (the {victim}) and recomputes it later.",
                      "请求多于 KV 池能容纳的：调度器抢占最近准入的请求（{victim}），之后重新计算。"),
    "preset_d_help": ("Arrival times and lengths from the Azure LLM inference trace 2023 (conversation), "
                      "Patel et al., Splitwise, ISCA 2024.",
                      "到达时间与长度来自 Azure LLM 推理轨迹 2023（对话），Patel 等，Splitwise，ISCA 2024。"),
    "preset_e_help": ("Your own synthetic workload: Poisson arrivals, uniform lengths.",
                      "自定义合成负载：泊松到达，长度均匀分布。"),
    "preset_f_help": ("Prompts that repeat a phrase: prompt lookup (n-gram speculative decoding) proposes the "
                      "next tokens from the request's own text, and one forward verifies them. In the batch tab a "
                      "decode carries 1 + k tokens: dotted = accepted proposals, crossed = rejected; the metrics "
                      "tab gives the acceptance rate and the tokens per step.",
                      "重复一个短语的提示：提示查找（n-gram 投机解码）从请求自身的文本中提议下一批词元，"
                      "一次前向验证它们。批次页中一个解码携带 1 + k 个词元：点状 = 被接受的提议，叉状 = 被拒绝的；"
                      "指标页给出接受率与每步词元数。"),
    "long_prompt_scale": ("Scale of the 8,000-token prompt", "8,000 词元提示的缩放比例"),
    "scale_note_a": ("Scaled for this CPU: the long prompt has {tokens:,} tokens (8,000 × {scale}).",
                     "为本机 CPU 缩放：长提示为 {tokens:,} 词元（8,000 × {scale}）。"),
    "scale_note_d": ("Scaled for this CPU: first {n} requests of the trace, token lengths × {scale}; arrivals "
                     "{speedup:g}× faster than recorded (the trace's {span_s:.1f} s in {span_fast_s:.2f} s).",
                     "为本机 CPU 缩放：取轨迹前 {n} 个请求，词元长度 × {scale}；到达速度为原记录的 {speedup:g} 倍"
                     "（轨迹的 {span_s:.1f} 秒压缩到 {span_fast_s:.2f} 秒）。"),
    "trace_speedup": ("Arrival speed-up (× the recorded rate; 1 = as recorded)",
                      "到达加速（× 原记录的速率；1 = 按原记录）"),
    "trace_max_requests": ("Requests taken from the trace", "从轨迹中取的请求数"),
    "trace_length_scale": ("Token length scale", "词元长度缩放"),
    "trace_missing": ("The Azure trace file is not here ({path}); preset (d) is skipped. Upload a CSV in the same "
                      "format (TIMESTAMP,ContextTokens,GeneratedTokens) below.",
                      "这里没有 Azure 轨迹文件（{path}）；跳过预设 (d)。可在下面上传同格式的 CSV"
                      "（TIMESTAMP,ContextTokens,GeneratedTokens）。"),
    "trace_upload": ("Your own trace (CSV: TIMESTAMP,ContextTokens,GeneratedTokens)",
                     "你自己的轨迹（CSV：TIMESTAMP,ContextTokens,GeneratedTokens）"),
    "trace_bad_upload": ("The uploaded trace could not be read: {error}", "无法读取上传的轨迹：{error}"),
    "trace_using_upload": ("Using the uploaded trace ({n} requests).", "使用上传的轨迹（{n} 个请求）。"),
    "num_requests": ("Number of requests", "请求数"),
    "prompt_len_range": ("Prompt length range (tokens)", "提示长度范围（词元）"),
    "output_len_range": ("Output length range (tokens)", "输出长度范围（词元）"),
    "arrival_rate": ("Arrival rate (requests/s, 0 = all at once)", "到达率（请求/秒，0 = 同时到达）"),
    "engine": ("Engine", "引擎"),
    "max_num_batched_tokens": ("Token budget (max_num_batched_tokens, tokens)",
                               "词元预算（max_num_batched_tokens，词元）"),
    "enable_chunked_prefill": ("Chunked prefill (enable_chunked_prefill)", "分块预填充（enable_chunked_prefill）"),
    "long_prefill_token_threshold": ("Longest prefill chunk (long_prefill_token_threshold, 0 = no cap)",
                                     "最长预填充分块（long_prefill_token_threshold，0 = 不限）"),
    "block_size": ("Block size (block_size, tokens)", "块大小（block_size，词元）"),
    "num_kv_blocks": ("KV blocks (num_kv_blocks)", "KV 块数（num_kv_blocks）"),
    "max_num_seqs": ("Sequence slots (max_num_seqs)", "序列槽位（max_num_seqs）"),
    "enable_prefix_caching": ("Prefix caching (enable_prefix_caching)", "前缀缓存（enable_prefix_caching）"),
    "preemption_mode": ("Preemption (preemption_mode)", "抢占方式（preemption_mode）"),
    "preemption_recompute": ("recompute", "重算"),
    "preemption_swap": ("swap to the CPU", "换出到 CPU"),
    "kv_cache_dtype": ("KV cache dtype (kv_cache_dtype)", "KV 缓存数据类型（kv_cache_dtype）"),
    "quantization": ("Weight quantization (quantization)", "权重量化（quantization）"),
    "quantization_none": ("none", "无"),
    "temperature": ("Sampling temperature (0 = greedy)", "采样温度（0 = 贪心）"),
    "stall_threshold": ("Stall threshold (ms; 0 = {k:g} × the run's median ITL)",
                        "停顿阈值（毫秒；0 = 本次运行词元间延迟中位数的 {k:g} 倍）"),
    "run": ("Run", "运行"),
    "press_run": ("Choose a workload and press Run.", "选择负载并点击“运行”。"),
    "wl_title": ("The workload: {n} requests, before they run", "负载：{n} 个请求（运行之前）"),
    "wl_prompt": ("prompt tokens", "提示词元"),
    "wl_output": ("output tokens (max_tokens)", "输出词元（max_tokens）"),
    "wl_request": ("request (in arrival order)", "请求（按到达顺序）"),
    "wl_tokens": ("tokens", "词元"),
    "wl_arrives_s": ("arrives at {s:.3f} s", "于 {s:.3f} 秒到达"),
    "wl_arrives_step": ("arrives before step {step}", "于第 {step} 步之前到达"),
    "stale_run": ("The controls changed since this run: press Run to run the new settings.",
                  "本次运行之后控件已更改：点击“运行”以运行新的设置。"),
    "running_engine": ("Running the engine…", "正在运行引擎…"),
    "loading_engine": ("Loading the model and building the engine…", "正在加载模型并构建引擎…"),
    "kernel_building": ("Compiling the CPU attention kernel ({seconds:.0f} s so far; once per machine, slower while "
                        "the machine is busy); the torch attention path runs meanwhile.",
                        "正在编译 CPU 注意力内核（已用 {seconds:.0f} 秒；每台机器只编译一次，机器繁忙时更慢）；"
                        "其间使用 torch 注意力路径。"),
    "kernel_waiting": ("Waiting for another process to finish building the CPU attention kernel ({seconds:.0f} s so "
                       "far); the torch attention path runs meanwhile.",
                       "正在等待另一个进程构建完 CPU 注意力内核（已等 {seconds:.0f} 秒）；其间使用 torch 注意力路径。"),
    "kernel_fallback": ("The CPU attention kernel is unavailable, so the torch attention path runs ({reason}).",
                        "CPU 注意力内核不可用，使用 torch 注意力路径（{reason}）。"),
    "kernel_loading": ("Loading the CPU attention kernel…", "正在加载 CPU 注意力内核…"),
    "kernel_off": ("The CPU attention kernel is switched off (MINENGINE_CPU_KERNEL=0): the torch attention path "
                   "runs.", "CPU 注意力内核已关闭（MINENGINE_CPU_KERNEL=0）：使用 torch 注意力路径。"),
    "kernel_reason_in_log": ("its build failed; the reason is in the server's log", "其构建失败；原因见服务器日志"),
    "loading_engine_kernel": ("Loading the model and building the engine; the first engine of this process also "
                              "loads the CPU attention kernel, or starts compiling it in the background…",
                              "正在加载模型并构建引擎；本进程的第一个引擎还要加载 CPU 注意力内核，或在后台开始编译它…"),
    "live_pause": ("❚❚ Pause", "❚❚ 暂停"),
    "live_resume": ("▶ Resume", "▶ 继续"),
    "finish_now": ("Finish now", "立即完成"),
    "live_run": ("Live run", "实时运行"),
    "live_speed": ("Speed while it runs (steps/s)", "运行时速度（步/秒）"),
    "full_speed": ("full", "全速"),
    "live_running": ("running", "运行中"),
    "live_paused": ("paused", "已暂停"),
    "live_waiting": ("Waiting for the first step…", "等待第一步…"),
    "live_played": ("Playing {played:.1f} steps/s ({asked:g} asked).",
                    "实际播放每秒 {played:.1f} 步（设定 {asked:g}）。"),
    "live_played_full": ("Playing {played:.1f} steps/s (full speed).", "实际播放每秒 {played:.1f} 步（全速）。"),
    "live_busy": ("This machine is busy: the live view plays {played:.1f} steps/s of the {asked:g} asked (each "
                  "redraw can take only the steps that fit its time). The run is the same, only slower to watch: its "
                  "times are on its own clock ({clock}).",
                  "本机繁忙：实时视图实际每秒播放 {played:.1f} 步，设定为 {asked:g} 步（每次重绘只能取其时间内"
                  "来得及的步骤）。运行本身不变，只是看起来更慢：它的时间记在它自己的时钟上（{clock}）。"),
    "live_status": ("**Live, {state}:** step {step}, {finished} of {total} requests finished, {time_s:.3f} s on "
                    "the clock ({clock}).", "**实时，{state}：** 第 {step} 步，已完成 {finished} / {total} 个请求，"
                    "时钟（{clock}）{time_s:.3f} 秒。"),
    "cap_live": ("While the engine runs, each redraw adds the steps it took meanwhile: the pool shows the latest "
                 "step, the bars and the token timeline grow to the right. When the run ends, its tabs let you go "
                 "back to any step.",
                 "引擎运行时，每次重绘都加入这段时间里完成的步骤：块池显示最新一步；"
                 "批次柱和词元时间线向右增长。运行结束后，下面的标签页可以回到任意一步。"),
    "bad_input": ("Bad input: {error}", "输入有误：{error}"),
    "run_failed": ("The engine refused this run: {error}", "引擎拒绝了这次运行：{error}"),
    "budget_raised": ("Without {cp} a whole prompt must fit in one step, so the token budget is raised to "
                      "{tokens:,} tokens (max_model_len + max_num_seqs: the longest prompt beside one decode per "
                      "slot).",
                      "关闭{cp}时整个提示必须在一步内完成，因此词元预算提高到 {tokens:,} 词元"
                      "（max_model_len + max_num_seqs：最长提示加上每个槽位一个解码词元）。"),
    "tab_blocks": ("Block tables", "块表"),
    "tab_batch": ("Batch composition", "批次组成"),
    "tab_tbt": ("TBT timeline", "TBT 时间线"),
    "tab_metrics": ("Metrics", "指标"),
    "tab_ab": ("A/B comparison", "A/B 对比"),
    "step_slider": ("Step", "步"),
    "animation": ("Animation: press ▶ to play the block pool step by step", "动画：点击 ▶ 逐步播放块池"),
    "play": ("▶ play", "▶ 播放"),
    "pause": ("❚❚ pause", "❚❚ 暂停"),
    "speed": ("Speed (steps/s)", "速度（步/秒）"),
    "cap_pool_base": ("Each square is one physical KV block, coloured by the request that holds it; light grey is "
                      "free.",
                      "每个方块是一个物理 KV 块，颜色表示持有它的请求；浅灰色为空闲。"),
    "cap_pool_shared": ("Look for dark grey numbered squares: blocks shared by several requests through a {hit} (the "
                        "number is the ref count).",
                        "注意深灰色带数字的方块：多个请求通过{hit}共享的块（数字为引用计数）。"),
    "cap_pool_cached": ("Pale blue squares are freed blocks that still hold a cached prefix (evictable, reusable).",
                        "浅蓝色方块是已释放但仍保存缓存前缀的块（可驱逐，也可复用）。"),
    "cap_tables_base": ("Each row is one running request's {bt}: logical block i of the sequence lives in the "
                        "physical block written in cell i. Consecutive logical blocks need not be adjacent "
                        "physically; the {sm} follows this table.",
                        "每行是一个运行中请求的{bt}：序列的第 i 个逻辑块存放在第 i 格所写的物理块中。"
                        "相邻逻辑块在物理上不必相邻；{sm}依此表计算。"),
    "cap_tables_shared": ("Dark grey cells (id*) are blocks shared with another request.",
                          "深灰色格子（编号*）是与其他请求共享的块。"),
    "cap_animation": ("Plotly's own player: ▶ plays the steps at the chosen speed, ❚❚ pauses, the slider jumps.",
                      "Plotly 自带播放器：▶ 按所选速度播放，❚❚ 暂停，滑块跳转。"),
    "cap_batch_base": ("Each bar is one step; each colour one request: hatched = {pf} chunk, solid = decode, under "
                       "the {tb} line; ▲ marks {adm}, ● a finished request.",
                       "每根柱子是一步，每种颜色是一个请求：斜线 = {pf}分块，实心 = 解码，位于{tb}线之下；"
                       "▲ 表示{adm}，● 表示请求完成。"),
    "cap_batch_a_chunked": ("Watch the long prompt's hatched chunks share steps with the solid decodes: no step "
                            "is much longer than the others, so no decode stalls ({hol} avoided).",
                            "观察长提示的斜线分块如何与实心解码同处每一步：没有哪一步特别长，解码不会停顿"
                            "（避免了{hol}）。"),
    "cap_batch_a_whole": ("The long prompt is one tall hatched bar: that one step computes all of it and every "
                          "decode waits for it ({hol}).",
                          "长提示是一根很高的斜线柱：这一步计算它的全部，所有解码都等它（{hol}）。"),
    "cap_batch_chunked": ("Prompts longer than what is left of the budget are split over several steps ({cp}).",
                          "超过剩余预算的提示被拆到多步中完成（{cp}）。"),
    "cap_batch_prefix": ("A request whose prompt starts with blocks already in the cache prefills only the rest "
                         "(a {hit}): its hatched bar is short.",
                         "提示开头的块已在缓存中的请求只预填充其余部分（{hit}）：它的斜线柱很短。"),
    "cap_batch_preempted": ("✖ marks a preemption: no free KV block was left, the victim's blocks were freed, and "
                            "it comes back later as a hatched re-prefill of its prompt and output so far "
                            "(recompute).",
                            "✖ 表示抢占：没有空闲 KV 块了，牺牲者的块被释放，之后它以斜线柱重新预填充"
                            "其提示和已生成部分（重算）。"),
    "cap_batch_swapped": ("✖ marks a preemption: no free KV block was left; the victim's blocks were copied to the "
                          "CPU (swap) and copied back when it resumed (a request's blocks that found no room in the "
                          "swap space are recomputed instead).",
                          "✖ 表示抢占：没有空闲 KV 块了；牺牲者的块被复制到 CPU（换出），恢复时再复制回来"
                          "（换出空间放不下的请求改为重算）。"),
    "cap_batch_spec": ("A verifying decode's bar carries 1 + k tokens: its own token (solid), the accepted proposals "
                       "(dotted) and the rejected ones (crossed, faded); the figure below zooms in on the decodes.",
                       "一个验证中的解码柱携带 1 + k 个词元：自身词元（实心）、被接受的提议（点状）和被拒绝的提议"
                       "（叉状、淡色）；下图放大显示解码部分。"),
    "cap_batch_waiting": ("While every {slot} or the budget is taken, new requests wait: they join the bars only "
                          "when admitted (▲).",
                          "当所有{slot}或预算都被占用时，新请求只能等待：被准入（▲）后才出现在柱中。"),
    "cap_spec_title": ("Decodes per step, zoomed: own tokens, accepted and rejected proposals",
                       "每步的解码（放大）：自身词元、被接受与被拒绝的提议"),
    "cap_spec": ("Only the decodes of each step, summed over requests, on their own scale: each verifying decode "
                 "computes its own token plus k proposals; the model accepts a prefix of them (dotted) and the rest "
                 "(crossed) were computed for nothing. Steps with more dotted than crossed tokens paid off.",
                 "只画每步的解码（各请求相加），用其自己的刻度：每个验证中的解码计算自身词元加 k 个提议；"
                 "模型接受其中的前缀（点状），其余（叉状）白算了。点状多于叉状的步骤是划算的。"),
    "own_tokens": ("own token (1 per decode)", "自身词元（每个解码 1 个）"),
    "proposals_legend_accepted": ("accepted proposals (dotted)", "被接受的提议（点状）"),
    "proposals_legend_rejected": ("rejected proposals (crossed)", "被拒绝的提议（叉状）"),
    "decode_tokens_axis": ("decode tokens in the step (tokens)", "本步解码词元数（词元）"),
    "story_title": ("What the scheduler decided, step by step", "调度器每一步的决定"),
    "story_caption": ("One sentence per step, from the engine's step trace ({n} steps).",
                      "每步一句话，来自引擎的步骤轨迹（共 {n} 步）。"),
    "cap_timeline": ("One row per request; each tick is an output token, ○ the request's arrival (or first "
                     "scheduling), ◆ its first token. Gaps in a row are stalls: the request waited while another "
                     "step ran.",
                     "每行一个请求，每条短竖线是一个输出词元，○ 是请求到达（或首次调度），◆ 是首个词元。"
                     "行中的空隙就是停顿：请求在等待其他步骤运行。"),
    "cap_itl": ("Every inter-token gap of every request. Red points are stalls above the threshold; the {n} largest "
                "are labelled with the step that caused them (①, ②, …), and the table below names the cause of "
                "every one.",
                "每个请求的每个词元间隔。红点是超过阈值的停顿；最大的 {n} 个标出了造成它的那一步（①、②…），"
                "下表列出每个停顿的原因。"),
    "cap_itl_one": ("Every inter-token gap of every request. Red points are stalls above the threshold; the largest "
                    "is labelled with the step that caused it (①), and the table below names the cause of every one.",
                    "每个请求的每个词元间隔。红点是超过阈值的停顿；最大的一个标出了造成它的那一步（①），"
                    "下表列出每个停顿的原因。"),
    "cap_itl_none": ("Every inter-token gap of every request. None is above the stall threshold (the dashed line), "
                     "so no point is red and none is labelled.",
                     "每个请求的每个词元间隔。没有一个超过停顿阈值（虚线），所以没有红点，也没有标注。"),
    "stall_table": ("Stalls and their causes", "停顿及其原因"),
    "col_label": ("label", "标注"),
    "col_token": ("output token #", "输出词元序号"),
    "col_time": ("time (s)", "时间（秒）"),
    "col_itl": ("ITL (ms)", "词元间延迟（毫秒）"),
    "col_cause": ("caused by", "原因"),
    "tokens_unit": ("tokens", "词元"),
    "no_stalls": ("No ITL above {threshold_ms:.1f} ms.", "没有超过 {threshold_ms:.1f} 毫秒的词元间延迟。"),
    "cap_queue": ("Running requests are bounded by {slot}s; waiting grows when the slots, the {tb} or the KV pool "
                  "are full.",
                  "运行中的请求数受{slot}限制；当槽位、{tb}或 KV 池满时，等待数增加。"),
    "cap_queue_none": ("Nothing waited in this run: every request was admitted the step it arrived (running is "
                       "bounded by {slot}s, the {tb} and the KV pool).",
                       "本次运行中没有请求等待：每个请求到达当步即被准入（运行数受{slot}、{tb}和 KV 池限制）。"),
    "cap_kv_base": ("Used blocks climb as prompts are prefilled and decodes grow, and fall as requests finish.",
                    "已用块随预填充和解码增长而上升，随请求完成而下降。"),
    "cap_kv_cached": ("Cached-but-free blocks are prefixes kept for later hits.",
                      "已缓存但空闲的块是留给之后命中的前缀。"),
    "cap_kv_preempted": ("Where free reached zero the scheduler had to preempt.", "空闲降为零之处调度器只能抢占。"),
    "cap_latency": ("The further right a curve, the slower. TTFT includes queueing and every prefill chunk; "
                    "TPOT is the mean gap after the first token.",
                    "曲线越靠右越慢。TTFT 包括排队和所有预填充分块；TPOT 是首词元之后的平均间隔。"),
    "metric_ttft": ("TTFT P{q} (ms)", "TTFT P{q}（毫秒）"),
    "metric_tpot": ("TPOT P{q} (ms)", "TPOT P{q}（毫秒）"),
    "metric_itl": ("ITL (TBT) P{q} (ms)", "ITL（TBT）P{q}（毫秒）"),
    "metric_throughput": ("Output throughput (tok/s)", "输出吞吐（词元/秒）"),
    "metric_preemptions": ("Preemptions", "抢占次数"),
    "metric_prefix": ("Prefix cache hit tokens (hit rate)", "前缀缓存命中词元（命中率）"),
    "metric_requests": ("Requests / steps", "请求数 / 步数"),
    "metric_spec_acceptance": ("Speculative acceptance (accepted / proposed)", "投机接受率（接受 / 提议）"),
    "metric_spec_length": ("Tokens per drafted decode (mean acceptance length)",
                           "每个投机解码的词元数（平均接受长度）"),
    "metric_tokens_per_step": ("Output tokens per step", "每步输出词元数"),
    "scheduling_policy": ("Scheduling policy (scheduling_policy)", "调度策略（scheduling_policy）"),
    "num_speculative_tokens": ("Speculative tokens per decode (num_speculative_tokens, n-gram; 0 = off)",
                               "每次解码的投机词元数（num_speculative_tokens，n-gram；0 = 关闭）"),
    "ab_knob": ("Setting to compare (each preset opens on its own)", "对比的设置（每个预设默认打开自己的那一项）"),
    "prefix_caching": ("prefix caching", "前缀缓存"),
    "ab_sentence": ("With {a} instead of {b}, P99 TBT is {itl_ms_a:.1f} ms vs {itl_ms_b:.1f} ms ({itl_pct:+.0f}%), "
                    "P99 TTFT {ttft_ms_a:.1f} ms vs {ttft_ms_b:.1f} ms ({ttft_pct:+.0f}%), and output throughput "
                    "{tput_a:.1f} vs {tput_b:.1f} tok/s ({tput_pct:+.0f}%).",
                    "{a}相对于{b}：P99 TBT 为 {itl_ms_a:.1f} 毫秒对 {itl_ms_b:.1f} 毫秒（{itl_pct:+.0f}%），"
                    "P99 TTFT 为 {ttft_ms_a:.1f} 毫秒对 {ttft_ms_b:.1f} 毫秒（{ttft_pct:+.0f}%），"
                    "输出吞吐为 {tput_a:.1f} 对 {tput_b:.1f} 词元/秒（{tput_pct:+.0f}%）。"),
    "ab_work": ("Work: {a} computed {tok_a:,} tokens in {steps_a:,} steps ({pre_a}, {swap_a} "
                "swapped out to the CPU); {b} {tok_b:,} tokens in {steps_b:,} steps ({pre_b}, {swap_b} "
                "swapped out).",
                "计算量：{a}在 {steps_a:,} 步中计算了 {tok_a:,} 个词元"
                "（{pre_a}，{swap_a}换出到 CPU）；"
                "{b}在 {steps_b:,} 步中计算了 {tok_b:,} 个词元（{pre_b}，{swap_b}换出）。"),
    # the counts of ab_work, singular and plural ("1 preemption", "5 preemptions")
    "ab_preemption": ("{n:,} preemption", "{n:,} 次抢占"),
    "ab_preemptions": ("{n:,} preemptions", "{n:,} 次抢占"),
    "ab_kv_block": ("{n:,} KV block", "{n:,} 个 KV 块"),
    "ab_kv_blocks": ("{n:,} KV blocks", "{n:,} 个 KV 块"),
    "ab_block": ("{n:,} block", "{n:,} 个块"),
    "ab_blocks": ("{n:,} blocks", "{n:,} 个块"),
    "ab_ttft_title": ("TTFT of each request, A vs B (dashed: P99 over requests)",
                      "每个请求的 TTFT，A 对 B（虚线：各请求的 P99）"),
    "ab_tbt_title": ("Longest token gap per request (dashed: run's P99 TBT)",
                     "每个请求的最长 token 间隔（虚线：整轮的 P99 TBT）"),
    "ab_ttft_axis": ("TTFT (ms)", "TTFT（毫秒）"),
    "ab_tbt_axis": ("longest gap of the request (ms)", "该请求的最长间隔（毫秒）"),
    "ab_chunked_prefill_a": ("A: chunked prefill on", "A：开启分块预填充"),
    "ab_chunked_prefill_b": ("B: chunked prefill off", "B：关闭分块预填充"),
    "ab_prefix_caching_a": ("A: prefix caching on", "A：开启前缀缓存"),
    "ab_prefix_caching_b": ("B: prefix caching off", "B：关闭前缀缓存"),
    "ab_preemption_mode_a": ("A: preempt by recompute", "A：抢占后重算"),
    "ab_preemption_mode_b": ("B: preempt by swap", "B：抢占后换出"),
    "ab_max_num_seqs_a": ("A: 16 sequence slots", "A：16 个序列槽位"),
    "ab_max_num_seqs_b": ("B: 4 sequence slots", "B：4 个序列槽位"),
    "ab_token_budget_a": ("A: token budget 256", "A：词元预算 256"),
    "ab_token_budget_b": ("B: token budget 64", "B：词元预算 64"),
    "ab_speculation_a": ("A: 4 speculative tokens", "A：4 个投机词元"),
    "ab_speculation_b": ("B: no speculation", "B：不投机"),
    "ab_chunked_prefill": ("chunked prefill", "分块预填充"),
    "ab_prefix_caching": ("prefix caching", "前缀缓存"),
    "ab_preemption_mode": ("recompute vs swap", "重算 对 换出"),
    "ab_max_num_seqs": ("sequence slots", "序列槽位"),
    "ab_token_budget": ("token budget", "词元预算"),
    "ab_speculation": ("speculation", "投机解码"),
    "ab_look_chunked_prefill": ("Look at the TBT: without chunking, a prompt's whole prefill is one step, and every "
                                "decode in that step waits for it.",
                                "看 TBT：不分块时，一个提示的整个预填充是一步，这一步里的每个解码都要等它。"),
    "ab_look_prefix_caching": ("Look at the TTFT and the tokens computed: with the cache, a request whose prompt "
                               "starts like an earlier one prefills only the rest.",
                               "看 TTFT 和计算的词元数：有缓存时，提示开头与之前请求相同的请求只需预填充其余部分。"),
    "ab_look_preemption_mode": ("Look at the work: recompute prefills a victim again (more tokens computed), swap "
                                "copies its blocks to the CPU and back (blocks swapped, priced on the host link).",
                                "看计算量：重算会重新预填充牺牲者（计算更多词元），换出则把它的块复制到 CPU 再复制回来"
                                "（换出的块，按主机链路计价）。"),
    "ab_look_max_num_seqs": ("Look at the TTFT: with fewer sequence slots, arrivals queue before their first step.",
                             "看 TTFT：序列槽位越少，新到的请求在第一步之前排队越久。"),
    "ab_look_token_budget": ("Look at TTFT against TBT: a bigger budget admits prompts sooner, and each step that "
                             "carries them lasts longer for the decodes beside them.",
                             "比较 TTFT 与 TBT：预算越大，提示越早被处理，而带着它们的那一步对旁边的解码来说也越长。"),
    "ab_look_speculation": ("Look at the steps and the TBT: accepted proposals give a request several tokens in one "
                            "step.",
                            "看步数和 TBT：被接受的提议让一个请求在一步中得到多个词元。"),
    "ab_measured": ("Measured clock: A and B were both run just now, back to back in this session ({when}, load "
                    "average {load:.1f} on {cpus} CPUs), not taken from the live run or another session's cache.",
                    "实测时钟：A 和 B 都是刚才在本会话中先后运行的（{when}，{cpus} 个 CPU 上的平均负载 {load:.1f}），"
                    "不取自实时运行或其他会话的缓存。"),
    "cap_ab": ("The same workload under both settings, everything else as in the sidebar.",
               "同一负载在两种设置下运行，其余设置与侧栏相同。"),
    "run_time": ("The engine took {seconds:.1f} s of real time on this machine (model loading included, pauses "
                 "not) for {steps} steps; the times in the figures are on the clock {clock}.",
                 "引擎在本机用了 {seconds:.1f} 秒实际时间（含模型加载，不含暂停），共 {steps} 步；"
                 "图中的时间按时钟：{clock}。"),
    "times_on_clock": ("Times on the clock “{clock}”.", "以下时间的时钟为「{clock}」。"),
    "clock": ("Clock", "时钟"),
    "clock_kind": ("Time the steps by", "步骤计时方式"),
    "clock_modelled": ("modelled GPU (roofline)", "建模 GPU（屋顶线模型）"),
    "clock_cpu": ("measured CPU time (this machine)", "实测 CPU 时间（本机）"),
    "clock_hardware": ("Hardware", "硬件"),
    "clock_model": ("Model shape (times only)", "模型形状（仅用于计时）"),
    "clock_modelled_help": ("The tokens are computed by the bundled model on this CPU; each step lasts what a "
                            "roofline model says it would on this GPU for this model shape. The same on every "
                            "machine, every run.",
                            "词元由本机 CPU 上的内置模型真实计算；每一步的时长按屋顶线模型估算该 GPU 上运行该模型"
                            "形状所需的时间。在任何机器上、每次运行都相同。"),
    "clock_cpu_help": ("Each step lasts the CPU time this process spent on it: real, but it depends on this "
                       "machine.", "每一步的时长为本进程在该步上花费的 CPU 时间：真实，但取决于本机。"),
    # ---- a live server (minengine.viz.server_feed) ----------------------------------------------------------
    "source": ("Source", "数据来源"),
    "source_local": ("local run (the engine in this page)", "本地运行（本页中的引擎）"),
    "source_server": ("live server (python -m minengine serve)", "实时服务器（python -m minengine serve）"),
    "server": ("Live server", "实时服务器"),
    "server_intro": ("Attaches to a running `python -m minengine serve` and draws its steps as they happen, from "
                     "its step feed (GET /v1/engine/steps): real clients, real scheduling, the same figures as a "
                     "local run. Start one with `python -m minengine serve`, send it requests (curl, the openai "
                     "client, `python -m minengine bench-serve --base-url URL`), then press Connect.",
                     "连接到正在运行的 `python -m minengine serve`，按其步骤流（GET /v1/engine/steps）实时画出每一步："
                     "真实的客户端、真实的调度，与本地运行相同的图。用 `python -m minengine serve` 启动服务器，"
                     "向它发送请求（curl、openai 客户端、`python -m minengine bench-serve --base-url URL`），"
                     "然后点击“连接”。"),
    "server_url": ("Server URL", "服务器地址"),
    "server_connect": ("Connect", "连接"),
    "server_disconnect": ("Disconnect", "断开"),
    "server_window": ("Steps on screen", "屏幕上显示的步数"),
    "server_press_connect": ("Enter the server's URL and press Connect.", "输入服务器地址并点击“连接”。"),
    "server_url_changed": ("The URL changed: press Connect to attach to {url}.",
                           "地址已更改：点击“连接”以连接 {url}。"),
    "server_connecting": ("Connecting to {url}…", "正在连接 {url}…"),
    "server_waiting": ("Connected to {url} ({model}): waiting for its first step. Send it a request.",
                       "已连接 {url}（{model}）：等待第一步。请向它发送请求。"),
    "server_status": ("**Live server {url}, {state}:** step {step}, {running} running, {waiting} waiting; {finished} "
                      "requests finished in the steps received (the replayed history included). "
                      "{model}: {blocks:,} KV blocks of {block_size} tokens, "
                      "token budget {budget:,} tokens, {seqs} sequence slots.",
                      "**实时服务器 {url}，{state}：** 第 {step} 步，{running} 个运行中，{waiting} 个等待中；"
                      "收到的各步中完成 {finished} 个请求（含回放的历史）。"
                      "{model}：{blocks:,} 个 KV 块（每块 {block_size} 词元），"
                      "词元预算 {budget:,} 词元，{seqs} 个序列槽位。"),
    "clock_does_not_fit": ("{model} does not fit {hardware}: its weights need {need_gb:.1f} GB per GPU, 90 % of "
                           "the GPU's memory is {have_gb:.1f} GB (no room for a KV cache). The times below are "
                           "what the roofline says, for a deployment no engine could run: pick more GPUs (TP) or "
                           "a bigger GPU.",
                           "{model} 放不进 {hardware}：每块 GPU 需要 {need_gb:.1f} GB 存放权重，而 GPU 显存的 90% 只有 "
                           "{have_gb:.1f} GB（没有 KV 缓存的空间）。下面的时间只是屋顶线模型的估算，对应一个没有引擎"
                           "能运行的部署：请选择更多 GPU（TP）或更大的 GPU。"),
    "server_state_connected": ("live", "实时接收中"),
    "server_state_stopped": ("disconnected", "已断开"),
    "server_state_failed": ("connection lost", "连接中断"),
    "server_bad_url": ("Not a server URL: {error}", "不是有效的服务器地址：{error}"),
    "server_unreachable": ("Cannot reach {url} ({error}). Is `python -m minengine serve` running there, on that "
                           "port?",
                           "无法连接 {url}（{error}）。那里（该端口）是否在运行 `python -m minengine serve`？"),
    "server_not_minengine": ("{url} answered, but it is not a minengine server: {error}. The dashboard reads "
                             "minengine's step feed, GET /v1/engine/steps.",
                             "{url} 有应答，但不是 minengine 服务器：{error}。仪表盘读取的是 minengine 的步骤流 "
                             "GET /v1/engine/steps。"),
    "server_bad_event": ("{url} sent a step this dashboard cannot read ({error}): is it another minengine version?",
                         "{url} 发来一个本仪表盘无法读取的步骤（{error}）：是否是另一个版本的 minengine？"),
    "server_dropped": ("The connection to {url} dropped after step {step} ({steps:,} steps received here): {error}. "
                       "The figures show the steps received; press Connect to attach again.",
                       "与 {url} 的连接在第 {step} 步之后中断（这里共收到 {steps:,} 步）：{error}。图中是已收到的步骤；"
                       "点击“连接”可重新连接。"),
    "server_dropped_early": ("The connection to {url} dropped before any step arrived: {error}. Press Connect to "
                             "attach again.", "与 {url} 的连接在收到任何步骤之前中断：{error}。点击“连接”可重新连接。"),
    "server_stopped": ("Disconnected from {url} after step {step} ({steps:,} steps received here); press Connect to "
                       "attach again.", "已断开与 {url} 的连接（在第 {step} 步之后，这里共收到 {steps:,} 步）；"
                       "点击“连接”可重新连接。"),
    "server_stopped_early": ("Disconnected from {url}; press Connect to attach again.",
                             "已断开与 {url} 的连接；点击“连接”可重新连接。"),
    "server_session_ended": ("The feed from {url} stopped when this browser session went away; press Connect to "
                             "attach again.", "浏览器会话离开后，来自 {url} 的步骤流已停止；点击“连接”可重新连接。"),
    "server_num_dropped": ("The server skipped {n:,} steps for this dashboard (it read them too slowly); the step "
                           "numbers show the gaps.",
                           "服务器为本仪表盘跳过了 {n:,} 步（读取太慢）；步号中可以看到缺口。"),
    "server_num_lost": ("{n:,} steps that arrived while paused were dropped here (the buffer keeps the latest "
                        "{keep:,}).", "暂停期间到达的 {n:,} 步在这里被丢弃（缓冲区只保留最新的 {keep:,} 步）。"),
    "server_no_blocks": ("This server does not record block tables (started with --no-trace-block-tables): no block "
                         "pool or block tables to draw.",
                         "该服务器不记录块表（以 --no-trace-block-tables 启动）：无法画出块池和块表。"),
    "clock_live_server": ("wall clock: live server", "挂钟时间：实时服务器"),
    "clock_live_server_other": ("{clock}: live server", "{clock}：实时服务器"),
    "server_metrics": ("Since the server started, from its /metrics (read every 2 s):",
                       "自服务器启动以来，来自其 /metrics（每 2 秒读取一次）："),
    "server_metrics_last": ("Since the server started, from its /metrics (the last reading before the feed ended):",
                            "自服务器启动以来，来自其 /metrics（步骤流结束前的最后一次读取）："),
    "server_metrics_error": ("The server's /metrics could not be read: {error}", "无法读取服务器的 /metrics：{error}"),
    "sm_prompt": ("Prompt tokens", "提示词元"),
    "sm_preemptions": ("Preemptions", "抢占次数"),
    "sm_prefix": ("Prefix cache hit rate", "前缀缓存命中率"),
    "sm_finished": ("Finished requests", "已完成请求"),
    "sm_generation": ("Generated tokens", "已生成词元"),
    "sm_ttft": ("Mean TTFT (ms)", "平均 TTFT（毫秒）"),
    "sm_itl": ("Mean ITL (ms)", "平均 ITL（毫秒）"),
    "sm_e2e": ("Mean E2E latency (ms)", "平均端到端延迟（毫秒）"),
    "cap_server": ("Every figure is drawn from the server's own step records as they arrive, over the last {window} "
                   "steps. Times are the server's wall clock, so the idle time between requests shows as gaps. The "
                   "step feed carries no arrival times: the token timeline and the ITL start where a request was "
                   "first scheduled (TTFT is in the cards above, from /metrics).",
                   "每张图都按服务器自己的步骤记录实时绘制，显示最近 {window} 步。时间为服务器的挂钟时间，"
                   "请求之间的空闲表现为空隙。步骤流不含到达时间：词元时间线和词元间延迟从请求首次被调度时算起"
                   "（TTFT 见上方卡片，来自 /metrics）。"),
    # ---- a fleet behind vLLM's router (pages/Router.py, minengine.viz.router_feed) --------------------------
    "router_title": ("minengine: a fleet behind its router", "minengine：路由器后的服务集群"),
    "router_intro": ("Follows a fleet started with `python -m minengine fleet-serve`: the router (vLLM's "
                     "`vllm-router`) is asked for its replicas (GET /list_workers), and each replica's step feed is "
                     "read as the live-server view reads one server. A request shows up in the steps of the replica "
                     "the router sent it to, and in no other's: that is how the view tells which replica served it.",
                     "跟踪用 `python -m minengine fleet-serve` 启动的服务集群：向路由器（vLLM 的 `vllm-router`）查询"
                     "其副本（GET /list_workers），再像实时服务器视图那样读取每个副本的步骤流。一个请求只出现在路由器"
                     "把它发往的那个副本的步骤中：本视图据此判断每个请求由哪个副本处理。"),
    "router": ("Router", "路由器"),
    "router_url": ("Router URL", "路由器地址"),
    "router_api_key": ("API key (if the router and replicas need one)", "API 密钥（路由器和副本需要时）"),
    "router_press_connect": ("Enter the router's URL and press Connect.", "输入路由器地址并点击“连接”。"),
    "router_url_changed": ("The URL changed: press Connect to follow the router at {url}.",
                           "地址已更改：点击“连接”以跟踪 {url} 处的路由器。"),
    "router_error": ("Cannot follow this router: {error}", "无法跟踪该路由器：{error}"),
    "router_no_workers": ("The router at {url} has no workers.", "{url} 处的路由器没有任何副本。"),
    "router_replica_status": ("{state}: step {step}, {running} running, {waiting} waiting; KV blocks {used:,} / "
                              "{total:,} in use; {requests:,} requests; prefix cache hits {hit:,} / {queried:,} "
                              "prompt tokens",
                              "{state}：第 {step} 步，运行 {running} 个，等待 {waiting} 个；KV 块已用 {used:,} / "
                              "{total:,}；请求 {requests:,} 个；前缀缓存命中 {hit:,} / {queried:,} 个提示词元"),
    "router_replica": ("replica", "副本"),
    "router_finished": ("finished", "已完成"),
    "router_in_flight": ("not finished yet", "尚未完成"),
    "router_requests_title": ("Requests per replica", "每个副本的请求数"),
    "router_recent": ("Recent requests and the replica that served each (latest first)",
                      "最近的请求及处理它的副本（最新的在前）"),
    "router_col_first_seen": ("first scheduled (s ago)", "首次调度（几秒前）"),
    "router_col_tokens": ("tokens scheduled", "已调度词元"),
    "router_col_finished": ("finished", "已完成"),
    "router_caption": ("Counted over every step since Connect ({steps:,} steps from the replicas); the pools show "
                       "each replica's latest step, drawn as in the live-server view.",
                       "按连接以来的全部步骤统计（各副本共 {steps:,} 步）；块池显示每个副本最近一步的块，画法与"
                       "实时服务器视图相同。"),
    "model_missing": ("The bundled model is not at {path}. Run scripts/train_tiny_model.py or set MINENGINE_MODEL.",
                      "内置模型不在 {path}。请运行 scripts/train_tiny_model.py 或设置 MINENGINE_MODEL。"),
}


def t(key: str, lang: str) -> str:
    """The string for ``key`` in ``lang`` ("en" or "zh").

    Raises:
        ValueError: unknown language.
        KeyError: unknown key (a missing string is a bug, better loud than a blank label).
    """
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    en, zh = _STRINGS[key]
    return en if lang == "en" else zh


def keys() -> list[str]:
    """Every key of the table (for tests that check both languages are filled)."""
    return list(_STRINGS)
