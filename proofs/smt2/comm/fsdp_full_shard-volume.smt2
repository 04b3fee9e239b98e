; placement-logic proof obligation: comm/fsdp_full_shard-volume
; theorem: Communication derivation
; FSDP FULL_SHARD volume = 1.5 × DP
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: volume(FSDP FULL_SHARD) / volume(DP) = 1.5
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
(assert
 (let ((?x0 (to_real N)))
 (<= 2.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (not (= (/ 3.0 2.0) (/ 3.0 2.0))))
(check-sat)
(exit)
