; placement-logic proof obligation: memory/dp-model-state
; theorem: Memory derivation
; DP model state = (4 + K)Ψ
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 1: model_state(DP) = (4 + K)Ψ
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
 (<= 1.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (not (= (+ (* 4.0 psi) (* K psi)) (* psi (+ 4.0 K)))))
(check-sat)
(exit)
