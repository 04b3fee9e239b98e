"""Shared test setup: results are never read from the user's result cache, so every test
exercises the derivation itself (tests/test_cost_cache.py tests the cache, in a scratch folder);
and text output is laid out as it is for a pipe (no $COLUMNS from the terminal the suite runs
in), so golden files and document examples compare alike everywhere.

Tiers: ``pytest`` alone runs the quick tier (no real PyTorch runs, no solver-heavy sweeps,
pdflatex on one example only, a deterministic sample of each checker/simulator sweep: ``SAMPLED``,
property tests with a tenth of their examples: tests/tiers.py; it passes without the torch extra;
it runs on one worker per core when pytest-xdist is installed, as ``--tier all`` does: ``pytest_cmdline_main``;
docs/benchmarks.md, "The quick test tier", has its measured CPU and wall time);
``pytest --tier all`` (the README's command, and CI's) runs everything. A test is in the slow
tier when it is marked ``slow`` or ``torch``, or named in ``SLOW`` below (tests measured among
the slowest of the quick tier, kept whole rather than trimmed, and those of ``slow_measured.txt``), or is a case of a ``SAMPLED``
sweep outside its sample. ``-m EXPR`` selects by marker as usual and overrides the tier."""

import os
import re

import pytest

os.environ["PLACEMENT_NO_CACHE"] = "1"
os.environ.pop("COLUMNS", None)

# node ids (or their prefixes) of unmarked tests that belong to the slow tier, by measured time
SLOW = (
    # the tests of the whole `prove` run (one shared run of every group: over a minute)
    "tests/test_prove.py::test_every_obligation_as_expected_with_both_solvers",
    "tests/test_prove.py::test_theorem_groups_present",
    "tests/test_prove.py::test_published_memory_forms_are_the_ones_stated",
    "tests/test_prove.py::test_gi_necessity_witness_recomputed_by_hand",
    "tests/test_prove.py::test_sc_necessity_witness_shows_a_stale_replica",
    "tests/test_prove.py::test_each_broken_rule_is_refuted_with_a_counterexample",
    "tests/test_prove.py::test_compositions_cover_the_library_pairs",
    "tests/test_prove.py::test_zero_abstract_claims_exact_conditions",
    "tests/test_prove.py::test_zeropp_condition_on_the_scheduling_unit",
    "tests/test_prove.py::test_smt2_files_are_not_stale",
    "tests/test_properties.py::test_grammar_driven_fuzzing_never_crashes",
    "tests/test_properties.py::test_parse_of_format_is_identity",
    "tests/test_properties.py::test_formatting_is_idempotent",
    "tests/test_properties.py::test_generated_trees_resolve_or_diagnose",
    "tests/test_search.py::test_cli_table_emit_and_check",
    "tests/test_search.py::test_rows_carry_memory_per_stage_and_bytes_per_link_as_cost_does",
    "tests/test_search.py::test_hugging_face_config_is_a_model",
    "tests/test_search.py::test_vectorised_search_agrees_with_the_brute_force",
    "tests/test_search.py::test_plot_of_the_frontier",
    "tests/test_search.py::test_frontier_is_pareto_optimal",
    "tests/test_search.py::test_only_a_folded_layout_fits_and_search_finds_it",
    "tests/test_check_bruteforce.py::test_gi_verdict_matches_brute_force",
    "tests/test_check_bruteforce.py::test_norms_verdict_matches_brute_force",
    "tests/test_check_bruteforce.py::test_clip_verdict_matches_brute_force",
    "tests/test_json_schema.py::test_measure",
    "tests/test_json_schema.py::test_search",
    "tests/test_json_schema.py::test_inspect_cost_and_compare_of_every_example",
    "tests/test_latex.py::test_every_example_for_papers",
    "tests/test_latex.py::test_wide_comparisons_turn_sideways_with_plans_as_rows",
    "tests/test_latex.py::test_width_estimate_against_tex_when_pdflatex_present",  # every example set by TeX
    "tests/test_docs.py::test_document_examples",
    "tests/test_sweep.py::test_compiled_and_exact_rows_agree_with_literal_specs_to_the_byte",
    "tests/test_sweep.py::test_asserts_are_evaluated_per_configuration",
    "tests/test_sweep.py::test_compiled_rows_equal_single_set_derivations_on_examples",
    "tests/test_plot.py::",
    "tests/test_rebinding_checks.py::test_search_never_ranks_a_row_whose_sizes_a_file_refuses",
    "tests/test_cost_cli.py::test_every_example_reports",
    "tests/test_heads.py::test_one_kv_head_and_the_qk_norms_agree_with_the_simulator",
    "tests/test_framework_roundtrip.py::test_megatron_round_trip",
    "tests/test_framework_roundtrip.py::test_torchtitan_round_trip",
    "tests/test_folding.py::test_the_checker_follows_the_folding",
    "tests/test_group_modes.py::test_checker_agrees_with_the_simulator_on_group_modes",
    "tests/test_group_modes.py::test_a_group_placing_itself_is_the_plan_placing_it",
    "tests/test_progress.py::test_search_draws_a_bar_on_a_terminal_and_the_report_is_the_same",
    "tests/test_search_output.py::test_reserve_keeps_memory_free",
    "tests/test_search_output.py::test_text_reads_at_the_terminal_width",
    "tests/test_search_output.py::test_memory_in_the_units_cost_prints",
    "tests/test_search_output.py::test_zero3_and_fsdp_rows_with_the_same_figures_are_one_row",
    "tests/test_rebinding_checks.py::test_set_gives_the_diagnostics_of_the_written_value",
    "tests/test_prove.py::test_markdown_and_text_formats",
    "tests/test_prove.py::test_cli_json_matches_the_report_shape",
    "tests/test_product_binding.py::test_product_verdicts_are_the_one_axis_verdicts",
    "tests/test_framework_roundtrip.py::test_megatron_states_what_it_drops",
    "tests/test_framework_roundtrip.py::test_deepspeed_round_trip",
    # the same `cost --format latex` run as tests/test_latex.py::test_step_time_and_mfu_as_named_terms_every_line_short
    # (its quick case on the file's first plan), which asserts all this test does and more
    "tests/test_steptime.py::test_latex_carries_the_time_equations",
    # every published run of docs/validation_time.md derived twice (kernel model, MFU 1/2): about 10 s;
    # the quick tier keeps the document's own consistency checks and tests/test_steptime.py
    "tests/test_validation_time.py::test_each_row_is_what_the_model_predicts",
    "tests/test_validation_time.py::test_mean_and_max_error",
    "tests/test_validation_time.py::test_the_single_mfu_convention_is_reproduced",
    # the six slowest single tests left in the quick tier (1-2 s of CPU each, about 8.7 s together, measured
    # serially on an unloaded machine); the quick tier keeps other tests of each module
    "tests/test_frameworks.py::test_shipped_configurations_import_check_and_cost",
    "tests/test_search.py::test_rows_within_the_models_error_of_the_fastest_are_ties",
    "tests/test_search_program.py::test_a_search_gives_each_structure_the_figures_of_its_own_program",
    "tests/test_sweep_stream.py::test_long_text_table_is_the_table_rich_lays_out_whole",
    "tests/test_search_exact_rows.py::test_every_sampled_row_is_its_own_configuration",
    "tests/test_check_witness.py::test_nine_axis_bug_is_refuted_from_the_first_witness",
)


def _measured(path) -> tuple[str, ...]:
    """The node ids of ``tests/slow_measured.txt``: single tests measured among the slowest of the quick
    tier (CPU seconds after each), written by ``benchmarks/bench_quick_tier.py --mark-over S``, which
    leaves every module a quick test of its own."""
    from pathlib import Path

    lines = Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []
    return tuple(line.split("  #")[0].strip() for line in lines if line.strip() and not line.startswith("#"))


MEASURED = _measured(__file__.replace("conftest.py", "slow_measured.txt"))
SLOW = SLOW + MEASURED


# parametrised sweeps (one assertion over many plans, sizes or examples, each case a run of the checker
# or of a derivation against its oracle) of which the quick tier runs a deterministic sample and the
# full tier every case: the first case of each kind (a case's id with the pattern, by default its
# numbering, removed: `stated3-True-expected3` is of kind `stated-True-expected`) and every
# `STRIDE`-th case in the order the cases are written (the first, the STRIDE+1-th, ...). The rest
# are in the slow tier (marked ``slow``); `pytest --tier all` and `-m slow` run them.
STRIDE = 8
SAMPLED = {
    "tests/test_aux_stats_cells.py::test_the_verdict_agrees_with_the_simulator_and_by_hand": r"_.*",  # per scope
    "tests/test_aux_stats_cells.py::test_the_replayed_values_are_the_simulators": r"_.*",
    "tests/test_aux_stats_cells.py::test_random_statements_agree_with_the_simulator": r"\d+",
    "tests/test_rank_divisor_axes.py::test_products_over_different_axes_agree_with_the_simulator_and_by_hand": r".*",
    "tests/test_rank_count_axes.py::test_counts_over_two_axes_agree_with_the_simulator_and_by_hand": r"-ranks\d+.*",
    "tests/test_rank_sets.py::test_random_plans_with_rank_sets_agree_with_the_simulator": r"\d+",
    "tests/test_check_actflow.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_check_actflow_moe_roles.py::test_hand_cases_checker_and_oracle": r"\d+",
    "tests/test_check_actflow_context.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_check_actflow_etp.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_check_actflow_experts.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_aux_stats.py::test_the_statistics_scope_agrees_with_the_simulator_and_by_hand": r"_.*",  # per scope
    "tests/test_aux_stats.py::test_the_replayed_values_are_the_simulators": r"_.*",
    "tests/test_aux_stats.py::test_random_statistics_scopes_agree_with_the_simulator": r"\d+",
    "tests/test_check_subgroups.py::test_random_plans_agree_with_the_simulator": r"\d+",
    "tests/test_check_subgroups.py::test_rank_set_divisors_agree_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_subgroups.py::test_norm_blocks_agree_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_subgroups.py::test_grad_blocks_agree_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_vocabulary.py::test_sum_loss_verdicts_agree_with_the_simulator": r"[\s\S]*-",  # per data plan
    "tests/test_check_rankset.py::test_divisor_on_ranks_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_losses.py::test_term_verdicts_agree_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_simulator.py::test_clip_filter_pinned_sizes_agree_with_simulator": r"\d+",
    "tests/test_check_rankupdate.py::test_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_kv_norm.py::test_the_norm_over_copied_kv_heads_agrees_with_the_simulator": r"[\s\S]*",  # one kind
    "tests/test_check_clipagg.py::test_clip_aggregation_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_state.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_check_checkpoint.py::test_hand_cases": r"\d+",
    "tests/test_check_perrank_partial.py::test_rank0_only_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_cplayout.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_optimizers.py::test_checker_agrees_with_the_simulator": r"\d+",
    "tests/test_check_subgroups.py::test_strided_and_first_k_agree_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_nested.py::test_pinned_sizes_agree_with_the_simulator_and_by_hand": r"-.*",  # per plan
    "tests/test_param_groups.py::test_moe_every_kth_layer_falls_on_the_stages_that_hold_it": r"\d+",
    "tests/test_import_folding.py::test_megatron_folding_forms_megatron_groups_and_its_expert_bytes": r"[\s\S]*",
    "tests/test_text_tables.py::test_reports_print_as_rich_prints_them": r"^\d+-|\d+$",  # per example
    "tests/test_check_perrank_partial.py::test_clamp_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_perrank_partial.py::test_clamp_pinned_sizes_by_hand": r"\d+",
    "tests/test_tpbackward.py::test_the_saving_is_each_calls_overlap_with_its_product": r"\d+",
    # the newer solver sweeps (rank sets, statistics scopes, unequal groups, loss terms, lifted groups)
    "tests/test_check_rankset_axes.py::test_rank_set_over_two_axes_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_rankcount.py::test_count_on_ranks_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_rankproduct.py::test_the_product_on_each_rank_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_aux_stats_padding.py::test_the_verdict_agrees_with_the_simulator_and_by_hand": r"_.*",  # per scope
    "tests/test_aux_stats_padding.py::test_the_replayed_values_are_the_simulators": r"_.*",
    "tests/test_aux_stats_padding.py::test_random_statements_agree_with_the_simulator": r"\d+",
    "tests/test_unequal_groups.py::test_grad_groups_agree_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_unequal_groups.py::test_random_plans_with_unequal_groups_agree_with_the_simulator": r"\d+",
    "tests/test_check_loss_extras.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_check_ignored_tokens.py::test_checker_and_simulator": r"\d+",
    "tests/test_check_partial_eps.py::test_eps_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_trace_blocks.py::test_reductions_over_part_of_the_axis_are_lifted_by_their_groups": r"\d+",
    # the head splits, the statistics' groups, the capacity step, the mask-computed layouts, crossing copy groups,
    # clips on rank sets and partitions of two kinds (one kind each: the first and every STRIDE-th case)
    "tests/test_ulysses_heads.py::test_checker_agrees_with_the_simulator_over_every_group": r"[\s\S]*",
    "tests/test_aux_stats_split.py::test_free_counts_refute_and_equal_counts_prove": r"[\s\S]*",
    "tests/test_aux_stats_split.py::test_random_split_statistics_agree_with_the_simulator": r"\d+",
    "tests/test_capacity_dispatch.py::test_random_models_agree_with_the_simulator": r"[\s\S]*",
    "tests/test_capacity_dispatch.py::test_checker_and_simulator_agree": r"[\s\S]*",
    "tests/test_check_cplayout_ptrr.py::test_hand_cases_checker_and_simulator": r"\d+",
    "tests/test_kv_joint.py::test_generated_plans_agree_with_the_simulator": r"\d+",
    "tests/test_check_rankclips.py::test_combined_clips_agree_with_the_simulator_and_by_hand": r"[\s\S]*",
    "tests/test_check_subgroups_axes.py::test_two_kinds_over_two_axes_agree_with_the_simulator_and_by_hand": r"[\s\S]*",
    "tests/test_ulysses_heads.py::test_generated_plans_agree_with_the_simulator": r"\d+",
    "tests/test_ulysses_heads.py::test_gqa_costs_against_the_simulated_all_to_alls": r"[\s\S]*",
    "tests/test_check_cpshort.py::test_agrees_with_simulator": r"[\s\S]*",
    "tests/test_aux_stats_mixed.py::test_mixed_statements_agree_with_the_simulator": r"\d+",
    "tests/test_rank_sets_axes.py::test_verdict_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_amax.py::test_random_plans_agree_with_the_simulator": r"\d+",
    "tests/test_check_amax.py::test_agrees_with_the_simulator_and_by_hand": r"\d+",
    "tests/test_check_amax.py::test_random_two_statement_plans_agree_with_the_simulator": r"\d+",
    "tests/test_check_actflow.py::test_a_statement_over_two_separately_bound_tensor_groups_is_unknown": r"\d+",
    "tests/test_check_loss_scale_state.py::test_random_plans_agree_with_the_simulator": r"\d+",
    # derivations against their oracle over a grid of sizes and options (one kind per option set)
    "tests/test_folding.py::test_expert_memory_equals_the_enumerated_devices": r"\d+",
    "tests/test_activations_shape.py::test_per_layer_bytes_equal_the_saved_tensors": r"\d+",
    "tests/test_param_groups.py::test_megatron_current_estimator_convention": r"\d+",
    "tests/test_deepspeed_estimator.py::test_zero3_estimator": r"\d+",
    "tests/test_buckets.py::test_gathered_window_bounds_the_coordinator": r"\d+",
    "tests/test_check.py::test_schedule_reductions_match_the_roles": r"/.*",  # per corpus folder
}


def sampled_out(items) -> list:
    """The cases of the ``SAMPLED`` sweeps that the quick tier leaves out (see ``SAMPLED``)."""
    seen: dict[str, tuple[int, set]] = {}
    out = []
    for item in items:
        sweep, _, case = item.nodeid.partition("[")
        if sweep not in SAMPLED or not case:
            continue
        index, kinds = seen.setdefault(sweep, (0, set()))
        kind = re.sub(SAMPLED[sweep], "", case[:-1])
        if index % STRIDE and kind in kinds:
            out.append(item)
        kinds.add(kind)
        seen[sweep] = (index + 1, kinds)
    return out


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("quick", "all"), default=os.environ.get("PLACEMENT_TEST_TIER", "quick"),
                     help="quick (default): leave out the tests marked slow or torch; all: run every test")


def full_tier(config) -> bool:
    return config.getoption("--tier") == "all" or bool(config.getoption("-m"))


def _cores() -> int:
    """The cores this process may run on (pytest-xdist's ``auto`` counts them alike)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which turns -n into workers
def pytest_cmdline_main(config):
    """``pytest`` and ``pytest --tier all`` (the whole suite, no paths named) run on one worker per core
    (at most 4 for the whole suite) when pytest-xdist is installed (the ``test`` extra has it), each test
    module whole on one worker (its module-level data and caches built once); ``-n N`` (``-n 0``: one
    process) and ``--dist`` say otherwise. Named paths run in one process, as without xdist."""
    if (config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", 0) is None
            and not hasattr(config, "workerinput")
            and config.args_source is pytest.Config.ArgsSource.TESTPATHS
            and not config.option.collectonly and not config.option.usepdb):
        # the whole suite's workers hold about 1.4 GB each and start PyTorch ranks of their own: at most 4
        config.option.numprocesses = min(4, _cores()) if full_tier(config) else "auto"
        if config.option.dist == "no":
            config.option.dist = "loadfile"


def pytest_configure(config):
    # read by tests/tiers.py when the test modules are imported (property tests' example counts)
    os.environ["PLACEMENT_TEST_TIER_RUNNING"] = "all" if full_tier(config) else "quick"


_WHOLE_MODULE_MARK = re.compile(r"^pytestmark = .*\bpytest\.mark\.(slow|torch)\b", re.MULTILINE)


def pytest_ignore_collect(collection_path, config):
    """In the quick tier a test module that is wholly slow (marked so, or named whole in ``SLOW``) or
    wholly torch is not imported at all (several import torch on import: about 2 s of CPU each run)."""
    if full_tier(config) or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    rel = collection_path.relative_to(config.rootpath).as_posix()
    if rel + "::" in SLOW or _WHOLE_MODULE_MARK.search(collection_path.read_text()):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
    for item in sampled_out(items):
        item.add_marker(pytest.mark.slow)
    if full_tier(config):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("slow") or item.get_closest_marker("torch") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
