; placement-logic proof obligation: claims/zero-abstract-1
; theorem: Claims: zero-abstract.place
; ZeRO-3 uses 8x less memory than DP: holds ⇔ dp = 8
;   ∀ K > 0, dp ∈ ℤ, dp ≥ 1, psi > 0: (model_state(dp) / model_state(zero3) == 8) ⇔ dp = 8
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun dp () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
(assert
 (let ((?x0 (to_real dp)))
 (<= 1.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x1 (+ (* (* 4.0 psi) (/ 1.0 (to_real dp))) (* (* K psi) (/ 1.0 (to_real dp))))))
 (and (distinct ?x1 0.0) true)))
(assert
 (let ((?x0 (to_real dp)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x1 (+ (* (* 4.0 psi) (/ 1.0 (to_real dp))) (* (* K psi) (/ 1.0 (to_real dp))))))
(and (distinct (= 8.0 (* (/ 1.0 ?x1) (+ (* 4.0 psi) (* K psi)))) (= 8.0 (to_real dp))) true)))
(check-sat)
(exit)
